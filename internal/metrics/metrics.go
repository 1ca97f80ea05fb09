// Package metrics defines outboxd's Prometheus metrics on a registry of its
// own (no global state). Labels are bounded: lock names, destination names
// (from the configuration) and outcome kinds, never event ids.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/outboxd/outboxd/internal/buildinfo"
	"github.com/outboxd/outboxd/internal/keys"
)

// Metrics holds every collector. The zero value is not usable; use New.
type Metrics struct {
	Registry *prometheus.Registry

	// Sends, by destination (the configured names; "default" for the
	// single-sink configuration; "" for an event no route matches).
	Dispatched       *prometheus.CounterVec
	DispatchFailures *prometheus.CounterVec   // by destination and reason (a bounded kind: http_5xx, timeout, ...)
	DeadLettered     *prometheus.CounterVec   // by destination
	SendDuration     *prometheus.HistogramVec // one send's duration, by destination and outcome
	Duplicates       prometheus.Counter       // found already delivered in Redis, not resent
	ClaimsTakenOver  prometheus.Counter       // in-flight claims of an earlier holder taken over
	// IdempotencyForeign counts delivered marks found that belong to an
	// earlier row with the same id (a sequence rewind), overwritten, row sent.
	IdempotencyForeign prometheus.Counter
	SendsCut           prometheus.Counter // sends cut short by the lease's trust deadline
	LateCommits        prometheus.Counter // rows committed after poller.gap_wait, behind a later row of their aggregate
	GapsGivenUp        prometheus.Counter // gaps whose wait reached poller.gap_wait
	// ReadRestarts counts read states dropped because ids were reused under
	// the leader, by reason: ids_restarted, server_changed, sequence_rewound.
	ReadRestarts    *prometheus.CounterVec
	FenceRejections *prometheus.CounterVec
	DispatchLatency *prometheus.HistogramVec // by destination
	BatchSize       prometheus.Histogram
	BatchDuration   prometheus.Histogram

	LockHeld         *prometheus.GaugeVec
	CircuitOpen      *prometheus.GaugeVec // by destination: 1 while its circuit breaker is open
	Paused           *prometheus.GaugeVec // by destination: 1 while an operator paused it
	LockAcquisitions *prometheus.CounterVec
	LockLosses       *prometheus.CounterVec
	LockRenewFails   *prometheus.CounterVec
	LockWait         *prometheus.HistogramVec

	PendingEvents    prometheus.Gauge
	OldestPendingAge prometheus.Gauge
	DeadEvents       prometheus.Gauge

	ReconcileRuns  *prometheus.CounterVec // result: ok, skipped, failed
	ReconcileSwept *prometheus.CounterVec // sweep: marked, purged, purged_dead, purged_idempotency_keys

	BuildInfo *prometheus.GaugeVec // 1, labelled with the running build (internal/buildinfo)
}

// New registers every collector, plus Go runtime and process collectors.
func New() *Metrics {
	r := prometheus.NewRegistry()
	f := func(c prometheus.Collector) { r.MustRegister(c) }
	m := &Metrics{Registry: r}

	m.Dispatched = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outboxd_dispatched_total", Help: "Events delivered, by destination."}, []string{"destination"})
	m.DispatchFailures = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outboxd_dispatch_failures_total", Help: "Failed delivery attempts, by destination and reason (http_3xx, http_4xx, http_5xx, timeout, refused, connection, rejected, other)."}, []string{"destination", "reason"})
	m.DeadLettered = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outboxd_dead_lettered_total", Help: "Events dead-lettered (max attempts or permanent error), by destination."}, []string{"destination"})
	m.SendDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "outboxd_send_duration_seconds", Help: "One send's duration (a per-event sink's request; a batch sink's call), by destination and outcome.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}}, []string{"destination", "outcome"})
	m.Duplicates = prometheus.NewCounter(prometheus.CounterOpts{Name: "outboxd_already_delivered_total", Help: "Events found delivered in Redis and marked without resending."})
	m.ClaimsTakenOver = prometheus.NewCounter(prometheus.CounterOpts{Name: "outboxd_claims_taken_over_total", Help: "Idempotency claims of an earlier holder (crashed or replaced) taken over at once instead of waiting for their TTL."})
	m.IdempotencyForeign = prometheus.NewCounter(prometheus.CounterOpts{Name: "outboxd_idempotency_foreign_total", Help: "Idempotency keys found saying delivered for an earlier row with the same id (the ids came round again: a sequence rewind); never trusted: taken over and the row sent."})
	m.SendsCut = prometheus.NewCounter(prometheus.CounterOpts{Name: "outboxd_sends_cut_total", Help: "Sends cut short by the lease's trust deadline (a receiver slower than the lease, or a lost lease)."})
	m.LateCommits = prometheus.NewCounter(prometheus.CounterOpts{Name: "outboxd_late_commits_total", Help: "Rows that committed after poller.gap_wait, after a later row of their aggregate was sent (delivered out of order, logged as late commit)."})
	m.GapsGivenUp = prometheus.NewCounter(prometheus.CounterOpts{Name: "outboxd_gaps_given_up_total", Help: "Uncommitted earlier ids whose wait reached poller.gap_wait, so the rows above them went."})
	m.FenceRejections = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outboxd_fence_rejections_total", Help: "Writes refused by the Postgres fence (stale token)."}, []string{"lock"})
	m.DispatchLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "outboxd_dispatch_latency_seconds", Help: "From created_at to delivered, by destination.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}}, []string{"destination"})
	m.BatchSize = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "outboxd_batch_size", Help: "Rows per fetched batch.",
		Buckets: prometheus.ExponentialBuckets(1, 2, 14)})
	m.BatchDuration = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "outboxd_batch_duration_seconds", Help: "Fetch to results written.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)})

	m.LockHeld = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "outboxd_lock_held", Help: "1 while this replica holds the lock."}, []string{"lock"})
	m.CircuitOpen = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "outboxd_circuit_open", Help: "1 while the destination's circuit breaker is open (its sends held, no attempts charged)."}, []string{"destination"})
	m.Paused = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "outboxd_destination_paused", Help: "1 while an operator paused the destination (outboxd pause); read from Postgres at each scrape."}, []string{"destination"})
	m.LockAcquisitions = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outboxd_lock_acquisitions_total", Help: "Locks acquired."}, []string{"lock"})
	m.LockLosses = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outboxd_lock_losses_total", Help: "Held locks lost: terms that ended other than by their own release (renewal refused, trust deadline passed, a write refused by the fence, the key gone at release)."}, []string{"lock"})
	m.LockRenewFails = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outboxd_lock_renew_failures_total", Help: "Failed lease renewals."}, []string{"lock"})
	m.LockWait = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "outboxd_lock_wait_seconds", Help: "Time from starting to wait to acquiring.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10)}, []string{"lock"})

	m.PendingEvents = prometheus.NewGauge(prometheus.GaugeOpts{Name: "outboxd_pending_events", Help: "Undelivered, not dead rows."})
	m.OldestPendingAge = prometheus.NewGauge(prometheus.GaugeOpts{Name: "outboxd_oldest_pending_age_seconds", Help: "Age of the oldest undelivered row."})
	m.DeadEvents = prometheus.NewGauge(prometheus.GaugeOpts{Name: "outboxd_dead_events", Help: "Dead-lettered rows in the table."})

	m.ReadRestarts = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outboxd_read_restarts_total", Help: "Read states the leader dropped because outbox ids may be reused below its cursor, by reason: ids_restarted (TRUNCATE, RESTART), server_changed (failover, restore, restart: the saved cursor is reloaded), sequence_rewound (setval back: read from the start)."}, []string{"reason"})
	for _, r := range []string{"ids_restarted", "server_changed", "sequence_rewound"} {
		m.ReadRestarts.WithLabelValues(r)
	}
	m.ReconcileRuns = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outboxd_reconcile_runs_total", Help: "Reconciliation fire times by result."}, []string{"result"})
	m.ReconcileSwept = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outboxd_reconcile_rows_total", Help: "Rows changed by reconciliation sweeps."}, []string{"sweep"})

	m.BuildInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "outboxd_build_info", Help: "Always 1; the labels say which build runs (version, commit, go_version)."},
		[]string{"version", "commit", "go_version"})
	b := buildinfo.Get()
	m.BuildInfo.WithLabelValues(b.Version, b.Commit, b.GoVersion).Set(1)

	for _, c := range []prometheus.Collector{
		m.Dispatched, m.DispatchFailures, m.DeadLettered, m.SendDuration, m.Duplicates, m.ClaimsTakenOver, m.IdempotencyForeign, m.SendsCut, m.LateCommits, m.GapsGivenUp, m.ReadRestarts, m.FenceRejections, m.DispatchLatency,
		m.BatchSize, m.BatchDuration, m.LockHeld, m.CircuitOpen, m.Paused, m.LockAcquisitions, m.LockLosses, m.LockRenewFails, m.LockWait,
		m.PendingEvents, m.OldestPendingAge, m.DeadEvents, m.ReconcileRuns, m.ReconcileSwept, m.BuildInfo,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	} {
		f(c)
	}
	// Export the labelled contract series at 0 from the start, so dashboards
	// and alerts see them before the first event.
	for _, l := range keys.Locks {
		m.FenceRejections.WithLabelValues(l)
		m.LockHeld.WithLabelValues(l)
		m.LockAcquisitions.WithLabelValues(l)
		m.LockLosses.WithLabelValues(l)
		m.LockRenewFails.WithLabelValues(l)
		m.LockWait.WithLabelValues(l)
	}
	for _, r := range ReconcileResults {
		m.ReconcileRuns.WithLabelValues(r)
	}
	for _, s := range ReconcileSweeps {
		m.ReconcileSwept.WithLabelValues(s)
	}
	return m
}

// ReconcileResults and ReconcileSweeps are the label values of
// outboxd_reconcile_runs_total{result} and outboxd_reconcile_rows_total{sweep}.
var (
	ReconcileResults = []string{"ok", "skipped", "failed"}
	ReconcileSweeps  = []string{"marked", "purged", "purged_dead", "purged_idempotency_keys"}
)

// Destinations exports the per-destination series at 0 for each name, so
// dashboards and alerts see every destination before its first event:
// failures for each of reasons, send durations for each of outcomes (the
// sinks' label values: dispatch.FailureReasons, dispatch.SendOutcomes).
func (m *Metrics) Destinations(names, reasons, outcomes []string) {
	for _, n := range names {
		m.Dispatched.WithLabelValues(n)
		m.DispatchLatency.WithLabelValues(n)
		m.DeadLettered.WithLabelValues(n)
		for _, r := range reasons {
			m.DispatchFailures.WithLabelValues(n, r)
		}
		for _, o := range outcomes {
			m.SendDuration.WithLabelValues(n, o)
		}
		m.CircuitOpen.WithLabelValues(n)
		m.Paused.WithLabelValues(n)
	}
}

// SetBacklog sets the backlog gauges (outboxd_pending_events,
// outboxd_oldest_pending_age_seconds, outboxd_dead_events): the one place
// both the scrape-time refresh and reconciliation's report set them.
func (m *Metrics) SetBacklog(pending int64, oldestPendingAge float64, dead int64) {
	m.PendingEvents.Set(float64(pending))
	m.OldestPendingAge.Set(oldestPendingAge)
	m.DeadEvents.Set(float64(dead))
}
