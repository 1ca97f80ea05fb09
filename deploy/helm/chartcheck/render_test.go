package chartcheck_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/strvals"
)

const (
	chartDir = "../outboxd"
	plainDir = "../../kubernetes"
	// The release the plain manifests stand for: objects named outboxd-*
	// in the namespace outboxd.
	releaseName = "outboxd"
	namespace   = "outboxd"
)

// values parses sets as `helm --set` does.
func values(t *testing.T, sets ...string) map[string]any {
	t.Helper()
	vals := map[string]any{}
	for _, s := range sets {
		if err := strvals.ParseInto(s, vals); err != nil {
			t.Fatalf("--set %s: %v", s, err)
		}
	}
	return vals
}

// rendered is one rendering of the chart, its objects in order.
type rendered []map[string]any

// render renders the chart as `helm template outboxd deploy/helm/outboxd
// -n outboxd` does with vals: values.schema.json is checked and templates'
// fail calls are errors.
func render(vals map[string]any) (rendered, error) {
	chrt, err := loader.Load(chartDir)
	if err != nil {
		return nil, err
	}
	install := action.NewInstall(&action.Configuration{Log: func(string, ...any) {}})
	install.DryRun, install.ClientOnly, install.Replace = true, true, true
	install.ReleaseName, install.Namespace = releaseName, namespace
	rel, err := install.Run(chrt, vals)
	if err != nil {
		return nil, err
	}
	manifest := rel.Manifest
	for _, h := range rel.Hooks {
		manifest += "\n---\n" + h.Manifest
	}
	return decode(manifest)
}

// mustRender renders vals or fails the test.
func mustRender(t *testing.T, vals map[string]any) rendered {
	t.Helper()
	r, err := render(vals)
	if err != nil {
		t.Fatalf("render %v: %v", vals, err)
	}
	return r
}

// decode reads the YAML documents of s, skipping empty ones.
func decode(s string) (rendered, error) {
	dec := yaml.NewDecoder(strings.NewReader(s))
	var out rendered
	for {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if m != nil {
			out = append(out, m)
		}
	}
}

func (r rendered) all(kind string) []map[string]any {
	var out []map[string]any
	for _, o := range r {
		if o["kind"] == kind {
			out = append(out, o)
		}
	}
	return out
}

// one is the only object of kind.
func (r rendered) one(t *testing.T, kind string) map[string]any {
	t.Helper()
	all := r.all(kind)
	if len(all) != 1 {
		t.Fatalf("%d objects of kind %s, want 1", len(all), kind)
	}
	return all[0]
}

// named is the object of kind named name, or nil.
func (r rendered) named(kind, name string) map[string]any {
	for _, o := range r.all(kind) {
		if get(o, "metadata", "name") == name {
			return o
		}
	}
	return nil
}

func get(m any, keys ...string) any {
	for _, k := range keys {
		mm, ok := m.(map[string]any)
		if !ok {
			return nil
		}
		m = mm[k]
	}
	return m
}

func list(m any, keys ...string) []any {
	l, _ := get(m, keys...).([]any)
	return l
}

// configOf parses the ConfigMap's config.yaml.
func configOf(t *testing.T, r rendered) map[string]any {
	t.Helper()
	var cfg map[string]any
	text, _ := get(r.one(t, "ConfigMap"), "data", "config.yaml").(string)
	if err := yaml.Unmarshal([]byte(text), &cfg); err != nil || cfg == nil {
		t.Fatalf("ConfigMap config.yaml %q: %v", text, err)
	}
	return cfg
}

// leaves flattens cfg to dotted keys and their values, stopping at a key
// known (a map-valued key such as dispatch.webhook.headers is one key).
func leaves(cfg map[string]any, prefix string, known map[string]bool, out map[string]any) {
	for k, v := range cfg {
		key := k
		if prefix != "" {
			key = prefix + "." + k
		}
		if m, ok := v.(map[string]any); ok && !known[key] {
			leaves(m, key, known, out)
			continue
		}
		out[key] = v
	}
}

// mountOf is the volume (from the pod's volumes) whose mount in ctr holds
// file directly, or nil.
func mountOf(pod, ctr any, file string) map[string]any {
	for _, m := range list(ctr, "volumeMounts") {
		if get(m, "subPath") != nil || get(m, "mountPath") != path.Dir(file) {
			continue
		}
		for _, v := range list(pod, "volumes") {
			if get(v, "name") == get(m, "name") {
				return v.(map[string]any)
			}
		}
	}
	return nil
}

// container is the pod's container (or init container) named name.
func container(t *testing.T, pod any, field, name string) map[string]any {
	t.Helper()
	for _, c := range list(pod, field) {
		if get(c, "name") == name {
			return c.(map[string]any)
		}
	}
	t.Fatalf("no %s named %s in %v", field, name, list(pod, field))
	return nil
}

// egressPorts lists the TCP ports the NetworkPolicy lets out, DNS aside.
func egressPorts(np map[string]any) []int {
	var out []int
	for _, rule := range list(np, "spec", "egress") {
		for _, p := range list(rule, "ports") {
			if n, ok := get(p, "port").(int); ok && n != 53 {
				out = append(out, n)
			}
		}
	}
	slices.Sort(out)
	return out
}

// show marshals v for a failure message.
func show(v any) string {
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(v); err != nil {
		return fmt.Sprint(v)
	}
	return b.String()
}
