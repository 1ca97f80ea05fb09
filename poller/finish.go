package poller

import (
	"context"
	"log/slog"
	"strconv"
	"time"

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
	// Sized for the batch: grown by append, their copies were a third of
	// finish's allocated bytes.
	delivered := make([]store.Delivered, 0, len(items))
	var failures []store.Failure
	var failedTo []string // each failure's destination
	names := make([]string, 0, len(items))
	ops := make([]byte, 0, len(items))     // finish.lua's letter per key
	marks := make([]string, 0, len(items)) // and the row's delivered mark per key
	now := time.Now()
	for _, it := range items {
		switch it.outcome {
		case sent:
			delivered = append(delivered, store.Delivered{ID: it.row.ID, CreatedAt: it.row.CreatedAt})
			names, ops, marks = append(names, p.keyOf(it)), append(ops, 'd'), append(marks, it.mark)
		case duplicate:
			delivered = append(delivered, store.Delivered{ID: it.row.ID, CreatedAt: it.row.CreatedAt})
		case pending:
			names, ops, marks = append(names, p.keyOf(it)), append(ops, 'u'), append(marks, "")
		case failed:
			names, ops, marks = append(names, p.keyOf(it)), append(ops, 'u'), append(marks, "")
			failures, failedTo = append(failures, p.failure(it)), append(failedTo, p.destination(it.row))
		case refused, poisoned:
			failures, failedTo = append(failures, p.failure(it)), append(failedTo, p.destination(it.row))
		}
	}
	if err := p.settleKeys(ctx, names, ops, marks, ours); err != nil {
		// Not fatal: an unreleased claim is taken over by the next batch, and a
		// missing delivered mark costs at most a duplicate. Postgres is the record.
		p.log.Warn("idempotency keys not updated", "error", err, "batch_size", len(items))
	}
	fire(p.hooks.afterFinalize)

	nd, nf, err := p.store.Complete(ctx, fence, delivered, failures)
	if err != nil {
		fail(span, err)
		return false, err
	}
	if span.IsRecording() {
		span.SetAttributes(AttrDelivered.Int64(nd), AttrFailed.Int(len(failures)))
	}
	// The per-event debug lines are built only when they are written: their
	// arguments cost an allocation per event otherwise (the id, boxed).
	debug := p.log.Enabled(ctx, slog.LevelDebug)
	for _, it := range items {
		switch it.outcome {
		case sent:
			dest := p.destination(it.row)
			p.m.Dispatched.WithLabelValues(dest).Inc()
			p.m.DispatchLatency.WithLabelValues(dest).Observe(now.Sub(it.row.CreatedAt).Seconds())
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
	for i, f := range failures {
		if f.Dead {
			p.m.DeadLettered.WithLabelValues(failedTo[i]).Inc()
			p.log.Warn("event dead-lettered", "outbox_id", f.ID, "error", f.Error)
		} else {
			p.log.Debug("delivery failed, will retry", "outbox_id", f.ID, "error", f.Error, "retry_in_ms", f.Delay.Milliseconds())
		}
	}
	p.m.BatchDuration.Observe(time.Since(start).Seconds())
	p.log.Debug("batch done", "batch_size", len(items), "delivered", nd, "failed", len(failures),
		"duration_ms", time.Since(start).Milliseconds())
	// A failure left unwritten is read again too: its row may be a new one
	// with the id (store.Failure.CreatedAt), never tried, below the cursor.
	return nd < int64(len(delivered)) || nf < int64(len(failures)), nil
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
