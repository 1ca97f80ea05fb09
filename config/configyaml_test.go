package config

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// commentedKeys may be shown in config.yaml as a comment only: their
// default is not one value (instance_id: the host name).
var commentedKeys = map[string]bool{"instance_id": true}

// config.yaml, the repository's reference file, lists every key: a key
// added to Config without a line there fails here.
func TestConfigYAMLListsEveryKey(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	flatten(doc, "", listed)
	for _, k := range Keys() {
		if listed[k] {
			continue
		}
		if commentedKeys[k] && regexp.MustCompile(`(?m)^# `+regexp.QuoteMeta(k)+`:`).Match(b) {
			continue
		}
		t.Errorf("config.yaml does not list %s", k)
	}
}

// flatten adds the dotted key of every leaf of m under prefix; a map that
// is itself a setting (dispatch.webhook.headers, dispatch.destinations)
// counts as listed when written, even empty.
func flatten(m map[string]any, prefix string, out map[string]bool) {
	for k, v := range m {
		key := strings.TrimPrefix(prefix+"."+k, ".")
		out[key] = true
		if sub, ok := v.(map[string]any); ok {
			flatten(sub, key, out)
		}
	}
}
