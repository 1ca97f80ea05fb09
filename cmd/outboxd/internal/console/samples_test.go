package console

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The ring holds its capacity of samples, the newest, oldest first.
func TestRingKeepsTheNewestSamplesInOrder(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name      string
		size, add int
	}{{"not full", 5, 3}, {"exactly full", 5, 5}, {"wrapped", 5, 12}, {"one", 1, 4}} {
		t.Run(tc.name, func(t *testing.T) {
			r := NewRing(tc.size, time.Second, nil)
			for i := range tc.add {
				r.Add(Sample{At: t0.Add(time.Duration(i) * time.Second)})
			}
			got := r.Samples()
			want := min(tc.size, tc.add)
			if len(got) != want {
				t.Fatalf("%d samples held, want %d", len(got), want)
			}
			for i, s := range got {
				if wantAt := t0.Add(time.Duration(tc.add-want+i) * time.Second); !s.At.Equal(wantAt) {
					t.Errorf("sample %d at %s, want %s", i, s.At, wantAt)
				}
			}
		})
	}
}

// A sample sums the delivered counter over destinations and keeps each.
func TestFromRegistryReadsTheRelaysCounters(t *testing.T) {
	reg := prometheus.NewRegistry()
	sent := prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricDispatched}, []string{"destination"})
	pending := prometheus.NewGauge(prometheus.GaugeOpts{Name: metricPending})
	reg.MustRegister(sent, pending)
	sent.WithLabelValues("a").Add(3)
	sent.WithLabelValues("b").Add(4)
	pending.Set(9)
	s := FromRegistry(reg, time.Now)()
	if s.Delivered != 7 || s.ByDest["a"] != 3 || s.ByDest["b"] != 4 || s.Pending != 9 {
		t.Errorf("sample %+v: want delivered 7 (a 3, b 4), pending 9", s)
	}
}

// The chart's rate never goes below zero (a counter that restarted), and a
// chart of a value that is not a number is drawn flat, at once.
func TestChartRatesAndScale(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	samples := []Sample{{At: t0, Delivered: 10}, {At: t0.Add(5 * time.Second), Delivered: 60}, {At: t0.Add(10 * time.Second), Delivered: 5}}
	got := rate(samples, func(s Sample) float64 { return s.Delivered })
	if len(got) != 2 || got[0].v != 10 || got[1].v != 0 {
		t.Errorf("rates %v, want 10/s then 0", got)
	}
	for _, v := range []float64{math.NaN(), math.Inf(1), 0, 0.3, 7, 1234} {
		if c := niceCeil(v); !(c >= 1) || (v >= 1 && v < 1e18 && c < v) {
			t.Errorf("niceCeil(%v) = %v", v, c)
		}
	}
	svg := string(svgChart(`a "title" <b>`, t0.Add(10*time.Second), time.Minute, line{"delivered", "x", got}))
	if strings.Contains(svg, "<b>") || !strings.Contains(svg, "<polyline") {
		t.Errorf("chart: %s", svg)
	}
}
