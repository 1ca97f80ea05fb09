package metrics_test

import (
	"reflect"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/internal/metrics"
)

// outboxd_build_info is exported from the start: one series, value 1,
// labelled version, commit and go_version.
func TestBuildInfoIsAlwaysExported(t *testing.T) {
	families, err := metrics.New().Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "outboxd_build_info" {
			continue
		}
		if len(f.GetMetric()) != 1 {
			t.Fatalf("%d series, want 1", len(f.GetMetric()))
		}
		m := f.GetMetric()[0]
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if m.GetGauge().GetValue() != 1 || len(labels) != 3 || labels["version"] == "" || labels["commit"] == "" ||
			labels["go_version"] != runtime.Version() {
			t.Fatalf("outboxd_build_info %v = %v, want 1 with version, commit and go_version %s", labels, m.GetGauge().GetValue(), runtime.Version())
		}
		return
	}
	t.Fatal("outboxd_build_info is not exported")
}

// Every counter is exported from the start, at 0 before its first event,
// once the destinations are named: a rate() or an absent() alert sees the
// series before anything happened.
func TestEveryCounterIsExportedFromTheStart(t *testing.T) {
	m := metrics.New()
	m.Destinations([]string{"default"}, []string{"http_5xx"}, []string{"delivered"})
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	gathered := map[string]int{}
	for _, f := range families {
		gathered[f.GetName()] = len(f.GetMetric())
	}
	v := reflect.ValueOf(m).Elem()
	for i := range v.NumField() {
		c, ok := v.Field(i).Interface().(prometheus.Collector)
		if !ok {
			continue
		}
		ch := make(chan *prometheus.Desc, 8)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			name := regexp.MustCompile(`fqName: "([^"]+)"`).FindStringSubmatch(d.String())[1]
			if strings.HasSuffix(name, "_total") && gathered[name] == 0 {
				t.Errorf("counter %s is not exported before its first event", name)
			}
		}
	}
	for _, s := range []string{"outboxd_dispatch_failures_total", "outboxd_dead_lettered_total", "outboxd_send_duration_seconds",
		"outboxd_lock_losses_total", "outboxd_lock_renew_failures_total", "outboxd_reconcile_runs_total", "outboxd_reconcile_rows_total"} {
		if gathered[s] == 0 {
			t.Errorf("%s has no series at the start", s)
		}
	}
}
