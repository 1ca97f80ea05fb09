package main

import (
	"bufio"
	"io"
	"maps"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/app"
	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/metrics"
)

const referenceFile = "../../docs/reference.md"

// TestReferenceMatchesTheCode keeps docs/reference.md, the contract in the
// repository, and the code in step: every configuration key (the config
// struct and the defaults handed to viper), every metric (the registry's
// collectors) and every CLI command (the cobra tree) has a row in its
// table, and every row names something that exists.
func TestReferenceMatchesTheCode(t *testing.T) {
	t.Parallel()
	doc := referenceTables(t)
	for _, c := range []struct {
		section string
		code    map[string]bool
	}{
		{"Configuration", configKeys()},
		{"Metrics", metricNames(t)},
		{"CLI", commandPaths(newRoot(io.Discard))},
	} {
		documented := doc[c.section]
		if len(documented) == 0 {
			t.Errorf("%s: no section %q with a table in %s", referenceFile, "## "+c.section+" (checked)", referenceFile)
			continue
		}
		for _, name := range slices.Sorted(maps.Keys(c.code)) {
			if !documented[name] {
				t.Errorf("%s: %q exists in the code but has no row in %s; add a row", c.section, name, referenceFile)
			}
		}
		for _, name := range slices.Sorted(maps.Keys(documented)) {
			if !c.code[name] {
				t.Errorf("%s: %q has a row in %s but does not exist in the code", c.section, name, referenceFile)
			}
		}
	}
}

// configKeys: the keys of the Config struct and of the defaults; the two
// must agree (config.Load refuses a key without a default), and a default
// for a key the struct lacks would be a key no one reads.
func configKeys() map[string]bool {
	out := map[string]bool{}
	for _, k := range config.Keys() {
		out[k] = true
	}
	for k := range config.Defaults(app.PartDefaults()) {
		out[k] = true
	}
	return out
}

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// metricNames: what the registry exports, and what every collector of
// metrics.Metrics describes (a labelled series not yet observed is not
// gathered). The Go and process collectors are left out.
func metricNames(t *testing.T) map[string]bool {
	m := metrics.New()
	out := map[string]bool{}
	add := func(name string) {
		if !strings.HasPrefix(name, "go_") && !strings.HasPrefix(name, "process_") {
			out[name] = true
		}
	}
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		add(f.GetName())
	}
	v := reflect.ValueOf(m).Elem()
	for i := range v.NumField() {
		c, ok := v.Field(i).Interface().(prometheus.Collector)
		if !ok {
			continue
		}
		ch := make(chan *prometheus.Desc, 64)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			if sub := fqName.FindStringSubmatch(d.String()); sub != nil {
				add(sub[1])
			}
		}
	}
	return out
}

// commandPaths: every runnable command below the root, as "name" or
// "parent name".
func commandPaths(root *cobra.Command) map[string]bool {
	out := map[string]bool{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			if sub.Name() == "help" || sub.Name() == "completion" {
				continue
			}
			if sub.Runnable() {
				out[strings.TrimPrefix(sub.CommandPath(), root.Name()+" ")] = true
			}
			walk(sub)
		}
	}
	walk(root)
	return out
}

// referenceTables reads the first cell of every table row under each
// "## <Section> (checked)" heading: its first `code span`, cut before the
// first flag or argument ("reconcile --once" -> "reconcile").
func referenceTables(t *testing.T) map[string]map[string]bool {
	f, err := os.Open(referenceFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]map[string]bool{}
	var section string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if h, ok := strings.CutPrefix(line, "## "); ok {
			section = ""
			if name, ok := strings.CutSuffix(h, " (checked)"); ok {
				section = name
				out[section] = map[string]bool{}
			}
			continue
		}
		if section == "" || !strings.HasPrefix(line, "| `") {
			continue
		}
		cell := strings.TrimPrefix(line, "| `")
		cell, _, _ = strings.Cut(cell, "`")
		var words []string
		for _, w := range strings.Fields(cell) {
			if strings.HasPrefix(w, "-") || strings.HasPrefix(w, "[") {
				break
			}
			words = append(words, w)
		}
		out[section][strings.Join(words, " ")] = true
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
