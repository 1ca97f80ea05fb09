package poller

import (
	"context"
	"log/slog"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/store"
)

// finish turns claims into delivered marks or releases them (finish.lua,
// one call per batch; per key in Redis Cluster, whose scripts cannot span
// slots), then writes every outcome to Postgres in one fenced statement.
// unmarked says some delivered rows were not marked, or some failures not
// written: already settled by someone, or no longer there, their ids taken
// by new rows (a failover or restore while the batch was in flight; see
// rewind.go), which the reader must read again.
func (p *Poller) finish(ctx context.Context, items []item, ours string, fence store.Fence, start time.Time) (unmarked bool, err error) {
	fire(p.hooks.beforeFinish)
	ctx, span := p.stage(ctx, SpanFinish)
	defer span.End()
	if span.IsRecording() {
		span.SetAttributes(AttrBatchSize.Int(len(items)))
	}
	now := time.Now()
	// Sized for the batch, so append never copies them. Made here and kept
	// in variables of their own, so those that do not escape may stay in
	// finish's frame.
	delivered, failures, failedTo := p.rowWrites(items, make([]store.Delivered, 0, len(items)))
	if p.rdb != nil {
		names, ops, marks := p.keyWrites(items, make([]string, 0, len(items)), make([]byte, 0, len(items)), make([]string, 0, len(items)))
		if err := p.settleKeys(ctx, names, ops, marks, ours); err != nil {
			// Not fatal: an unreleased claim is taken over by the next batch, and a
			// missing delivered mark costs at most a duplicate. Postgres is the record.
			p.log.Warn("idempotency keys not updated", "error", err, "batch_size", len(items))
		}
	}
	fire(p.hooks.afterFinalize)

	done, err := p.complete(ctx, fence, store.Outcomes{Delivered: delivered, Failures: failures}, items, ours)
	if err != nil {
		fail(span, err)
		return false, err
	}
	if span.IsRecording() {
		span.SetAttributes(AttrDelivered.Int64(done.Delivered), AttrFailed.Int(len(failures)))
	}
	p.countOutcomes(ctx, items, now)
	p.logFailures(failures, failedTo)
	p.m.BatchDuration.Observe(time.Since(start).Seconds())
	p.log.Debug("batch done", "batch_size", len(items), "delivered", done.Delivered, "failed", len(failures),
		"duration_ms", time.Since(start).Milliseconds())
	// A failure left unwritten is read again too: its row may be a new one
	// with the id (store.Failure.CreatedAt), never tried, below the cursor.
	return done.Delivered < int64(len(delivered)) || done.Failed < int64(len(failures)), nil
}

// rowWrites sorts items into what finish writes to Postgres: the rows to
// mark delivered (sent, or found delivered already), appended to
// delivered, and the failures (failed, refused, poisoned) with each
// failure's destination.
func (p *Poller) rowWrites(items []item, delivered []store.Delivered) ([]store.Delivered, []store.Failure, []string) {
	var failures []store.Failure
	var failedTo []string // each failure's destination
	for _, it := range items {
		switch it.outcome {
		case sent, duplicate:
			delivered = append(delivered, store.Delivered{ID: it.row.ID, CreatedAt: it.row.CreatedAt})
		case failed, refused, poisoned:
			failures, failedTo = append(failures, p.failure(it)), append(failedTo, p.destination(it.row))
		}
	}
	return delivered, failures, failedTo
}

// keyWrites appends to names, ops and marks what finish.lua does with
// items' idempotency keys: a sent item's key gets its delivered mark
// ('d'), a pending or failed item's key is released ('u'). A duplicate's
// key is already marked; a refused or poisoned item holds no claim.
func (p *Poller) keyWrites(items []item, names []string, ops []byte, marks []string) ([]string, []byte, []string) {
	for _, it := range items {
		switch it.outcome {
		case sent:
			names, ops, marks = append(names, p.keyOf(it)), append(ops, 'd'), append(marks, it.mark)
		case pending, failed:
			names, ops, marks = append(names, p.keyOf(it)), append(ops, 'u'), append(marks, "")
		}
	}
	return names, ops, marks
}

// countOutcomes counts each item's outcome in the metrics, with its
// latency from the row's creation to now for a sent one, and writes a
// debug line per delivered event.
func (p *Poller) countOutcomes(ctx context.Context, items []item, now time.Time) {
	// The per-event debug lines are built only when they are written: their
	// arguments cost an allocation per event otherwise (the id, boxed).
	debug := p.log.Enabled(ctx, slog.LevelDebug)
	var sends destinationSends
	for _, it := range items {
		switch it.outcome {
		case sent:
			sends.of(p, p.destination(it.row)).add(now.Sub(it.row.CreatedAt).Seconds())
			if debug {
				p.log.Debug("event delivered", "outbox_id", it.row.ID)
			}
		case duplicate:
			p.m.Duplicates.Inc()
			if debug {
				p.log.Debug("event already delivered, marked", "outbox_id", it.row.ID)
			}
		case failed, refused:
			p.m.DispatchFailures.WithLabelValues(p.destination(it.row), dispatch.FailureReason(it.err)).Inc()
		}
	}
	sends.count()
}

// destinationSends are a batch's delivered events by destination: each
// destination's series of outboxd_dispatched_total and
// outboxd_dispatch_latency_seconds is looked up once per batch, not once
// per event, and its counter is added to once.
type destinationSends struct {
	last *destinationSent // the destination of the event before: most batches have one
	all  []*destinationSent
}

type destinationSent struct {
	name    string
	n       int
	counter prometheus.Counter
	latency prometheus.Observer
}

// of is name's entry, made on its first event of the batch.
func (s *destinationSends) of(p *Poller, name string) *destinationSent {
	if s.last != nil && s.last.name == name {
		return s.last
	}
	for _, d := range s.all {
		if d.name == name {
			s.last = d
			return d
		}
	}
	s.last = &destinationSent{name: name, counter: p.m.Dispatched.WithLabelValues(name), latency: p.m.DispatchLatency.WithLabelValues(name)}
	s.all = append(s.all, s.last)
	return s.last
}

// add counts one delivered event of d, created latency seconds ago.
func (d *destinationSent) add(latency float64) {
	d.n++
	d.latency.Observe(latency)
}

// count adds each destination's delivered events to its counter.
func (s *destinationSends) count() {
	for _, d := range s.all {
		d.counter.Add(float64(d.n))
	}
}

// logFailures counts and logs each dead-lettered failure, and logs each
// failure left to retry; failedTo holds each failure's destination.
func (p *Poller) logFailures(failures []store.Failure, failedTo []string) {
	for i, f := range failures {
		if f.Dead {
			p.m.DeadLettered.WithLabelValues(failedTo[i]).Inc()
			p.log.Warn("event dead-lettered", "outbox_id", f.ID, "error", f.Error)
		} else {
			p.log.Debug("delivery failed, will retry", "outbox_id", f.ID, "error", f.Error, "retry_in_ms", f.Delay.Milliseconds())
		}
	}
}

// keyOf is it's idempotency key: the name claimKeys made, or made now for
// an item that was not claimed here.
func (p *Poller) keyOf(it item) string {
	if it.key != "" {
		return it.key
	}
	return p.keys.Idempotency(it.row.ID)
}

// destination names the destination of row's event (the metrics' label).
func (p *Poller) destination(row store.Row) string {
	return dispatch.DestinationOf(p.sink, dispatch.Event{AggregateType: row.AggregateType, EventType: row.EventType})
}

// settleKeys runs finish.lua over names with their ops letters and
// delivered marks.
func (p *Poller) settleKeys(ctx context.Context, names []string, ops []byte, marks []string, ours string) error {
	ttl := strconv.FormatInt(DeliveredTTL.Milliseconds(), 10)
	_, err := p.evalPerSlot(ctx, finishScript, names, func(lo, hi int) []any {
		args := make([]any, 0, 3+hi-lo)
		args = append(args, ours, ttl, string(ops[lo:hi]))
		for _, m := range marks[lo:hi] {
			args = append(args, m)
		}
		return args
	})
	return err
}
