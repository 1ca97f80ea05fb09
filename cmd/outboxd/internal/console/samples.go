package console

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Sample is the relay's own counters at one moment, as the chart draws
// them: cumulative counts of this process and the backlog gauges' last
// values.
type Sample struct {
	At        time.Time
	Delivered float64            // outboxd_dispatched_total, every destination
	ByDest    map[string]float64 // outboxd_dispatched_total by destination
	Failures  float64            // outboxd_dispatch_failures_total
	Pending   float64            // outboxd_pending_events, as last refreshed
	Lag       float64            // outboxd_oldest_pending_age_seconds, as last refreshed
}

// Ring keeps the last samples the relay took of its own counters, one
// every interval. Guarantee: it holds at most its capacity of samples,
// the oldest dropped first, so a relay that runs for months keeps a fixed
// memory for its chart; Samples returns them oldest first.
type Ring struct {
	every time.Duration
	read  func() Sample

	mu   sync.Mutex
	buf  []Sample
	next int // where the next sample goes
	n    int // samples held
}

// DefaultSamples and DefaultSampleEvery make the console's chart: the last
// ten minutes, a point every five seconds.
const (
	DefaultSamples     = 120
	DefaultSampleEvery = 5 * time.Second
)

// NewRing keeps size samples, taken by read every every (Run).
func NewRing(size int, every time.Duration, read func() Sample) *Ring {
	return &Ring{every: every, read: read, buf: make([]Sample, size)}
}

// Run samples at once and then every interval until ctx ends; it returns nil.
func (r *Ring) Run(ctx context.Context) error {
	t := time.NewTicker(r.every)
	defer t.Stop()
	for {
		r.Add(r.read())
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Add keeps s, dropping the oldest sample when full.
func (r *Ring) Add(s Sample) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.buf[r.next] = s
	r.next = (r.next + 1) % len(r.buf)
	r.n = min(r.n+1, len(r.buf))
}

// Samples returns the samples held, oldest first.
func (r *Ring) Samples() []Sample {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Sample, 0, r.n)
	start := (r.next - r.n + len(r.buf)) % len(r.buf)
	for i := range r.n {
		out = append(out, r.buf[(start+i)%len(r.buf)])
	}
	return out
}

// The metrics a Sample reads.
const (
	metricDispatched = "outboxd_dispatched_total"
	metricFailures   = "outboxd_dispatch_failures_total"
	metricPending    = "outboxd_pending_events"
	metricLag        = "outboxd_oldest_pending_age_seconds"
)

// FromRegistry reads a Sample from the relay's registry: no Postgres, no
// Redis; the backlog gauges are what the last scrape or console view set.
func FromRegistry(g prometheus.Gatherer, now func() time.Time) func() Sample {
	return func() Sample {
		s := Sample{At: now(), ByDest: map[string]float64{}}
		families, _ := g.Gather() // a partial gather still has the families it could read
		for _, f := range families {
			for _, m := range f.GetMetric() {
				switch f.GetName() {
				case metricDispatched:
					v := m.GetCounter().GetValue()
					s.Delivered += v
					for _, l := range m.GetLabel() {
						if l.GetName() == "destination" {
							s.ByDest[l.GetValue()] += v
						}
					}
				case metricFailures:
					s.Failures += m.GetCounter().GetValue()
				case metricPending:
					s.Pending = m.GetGauge().GetValue()
				case metricLag:
					s.Lag = m.GetGauge().GetValue()
				}
			}
		}
		return s
	}
}
