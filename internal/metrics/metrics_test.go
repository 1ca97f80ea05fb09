package metrics_test

import (
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/internal/keys"
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
	series := map[string][]string{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			var pairs []string
			for _, l := range m.GetLabel() {
				pairs = append(pairs, l.GetName()+"="+l.GetValue())
			}
			series[f.GetName()] = append(series[f.GetName()], strings.Join(pairs, ","))
		}
	}
	checkLabelValues(t, series, exportedAtStart([]string{"default"}, []string{"http_5xx"}, []string{"delivered"}))
}

// exportedAtStart is every labelled series the contract exports at 0 from
// the start, by metric name, each a set of label values written
// "name=value,..." in label order: the lock names, the reconciliation's
// results and sweeps, the read restarts' reasons, and per destination its
// failure reasons and send outcomes.
func exportedAtStart(destinations, reasons, outcomes []string) map[string][]string {
	want := map[string][]string{}
	add := func(metric string, series ...string) { want[metric] = append(want[metric], series...) }
	for _, l := range keys.Locks {
		for _, m := range []string{"outboxd_fence_rejections_total", "outboxd_lock_held", "outboxd_lock_acquisitions_total",
			"outboxd_lock_losses_total", "outboxd_lock_renew_failures_total", "outboxd_lock_wait_seconds"} {
			add(m, "lock="+l)
		}
	}
	// The contract's values (docs/reference.md, "Metrics"), not the package's lists.
	for _, r := range []string{"ok", "skipped", "failed"} {
		add("outboxd_reconcile_runs_total", "result="+r)
	}
	for _, s := range []string{"marked", "purged", "purged_dead", "purged_idempotency_keys"} {
		add("outboxd_reconcile_rows_total", "sweep="+s)
	}
	for _, r := range []string{"ids_restarted", "server_changed", "sequence_rewound"} {
		add("outboxd_read_restarts_total", "reason="+r)
	}
	for _, d := range destinations {
		for _, m := range []string{"outboxd_dispatched_total", "outboxd_dispatch_latency_seconds", "outboxd_dead_lettered_total",
			"outboxd_circuit_open", "outboxd_destination_paused"} {
			add(m, "destination="+d)
		}
		for _, r := range reasons {
			add("outboxd_dispatch_failures_total", "destination="+d+",reason="+r)
		}
		for _, o := range outcomes {
			add("outboxd_send_duration_seconds", "destination="+d+",outcome="+o)
		}
	}
	return want
}

// checkLabelValues fails unless each metric of want has exactly the series
// it lists in got (label values by metric name).
func checkLabelValues(t *testing.T, got, want map[string][]string) {
	t.Helper()
	for name, series := range want {
		slices.Sort(series)
		have := slices.Sorted(slices.Values(got[name]))
		if !slices.Equal(have, series) {
			t.Errorf("%s exported with %q at the start, want %q", name, have, series)
		}
	}
}
