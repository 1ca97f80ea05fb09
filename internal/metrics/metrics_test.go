package metrics_test

import (
	"runtime"
	"testing"

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
