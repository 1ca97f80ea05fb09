package poller

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/outboxd/outboxd/dispatch"
)

// delivered and poison rows do not block their aggregate.
func (p *Poller) deliver(ctx context.Context, items []item, token int64, trusted func() time.Time) {
	type aggKey struct{ t, id string }
	agg := func(i int) aggKey { return aggKey{items[i].row.AggregateType, items[i].row.AggregateID} }
	stopped := map[aggKey]bool{}
	var queue []int // rows to send, id order
	for i := range items {
		switch items[i].outcome {
		case foreign, refused:
			stopped[agg(i)] = true
		case pending:
			if !stopped[agg(i)] {
				queue = append(queue, i)
			}
		}
	}
	limit := p.sink.Capabilities().MaxBatch
	for len(queue) > 0 && ctx.Err() == nil && time.Now().Before(trusted()) {
		var chunk, rest []int
		for _, i := range queue {
			switch {
			case stopped[agg(i)]:
			case limit > 0 && len(chunk) == limit:
				rest = append(rest, i)
			default:
				chunk = append(chunk, i)
			}
		}
		queue = rest
		if len(chunk) == 0 {
			return
		}
		events := make([]dispatch.Event, len(chunk))
		for j, i := range chunk {
			r := items[i].row
			events[j] = dispatch.Event{ID: r.ID, AggregateType: r.AggregateType, AggregateID: r.AggregateID,
				EventType: r.EventType, Payload: r.Payload, Headers: r.Headers, CreatedAt: r.CreatedAt}
		}
		results := p.sink.Send(ctx, dispatch.Batch{Events: events, Token: token, Until: trusted})
		if len(results) != len(chunk) {
			// A sink that breaks its contract: trust none of it; claims are released.
			p.log.Error("sink returned a wrong number of results; nothing marked", "batch_size", len(chunk), "results", len(results))
			return
		}
		for j, i := range chunk {
			if !p.apply(ctx, &items[i], results[j]) {
				stopped[agg(i)] = true
			}
		}
	}
}

// apply records a sink's result on a row; false when its aggregate must
// stop here (anything but a delivery).
func (p *Poller) apply(ctx context.Context, it *item, r dispatch.Result) bool {
	switch r.Outcome {
	case dispatch.Delivered, dispatch.Duplicate:
		it.outcome = sent
		if r.Ref != "" || r.Outcome == dispatch.Duplicate {
			p.log.Debug("sink acknowledged", "outbox_id", it.row.ID, "result", r.Outcome.String(), "ref", r.Ref)
		}
		return true
	case dispatch.Retryable, dispatch.Permanent:
		err := r.Err
		if err == nil {
			err = errors.New("the sink reported a failure without a reason")
		}
		if r.Cut {
			it.outcome, it.err = p.cutShort(ctx, it.row.ID, err, r.Unanswered)
			return false
		}
		it.outcome, it.err = failed, &dispatch.Error{Err: err, Permanent: r.Outcome == dispatch.Permanent, RetryAfter: r.RetryAfter}
		return false
	default:
		return false // not attempted: stays pending, its claim is released
	}
}

// cutShort decides what a send cut short by the lease's trust deadline
// counts as. If the lease itself is gone, or shutdown ran out of time, the
// cut is ours, not the receiver's: no attempt is counted. If the lease is
// still held, the receiver answered slower than the lease allows; once is
// forgiven (a renewal may have been late), a second time for the same row
// counts as a failed attempt, so a hanging receiver cannot keep a row
// retrying forever without ever dead-lettering. A send the destination held
// without a final answer (r.Unanswered: a held socket) is not forgiven: it
// counts the first time.
func (p *Poller) cutShort(ctx context.Context, id int64, err error, unanswered bool) (outcome, error) {
	if ctx.Err() != nil {
		p.log.Debug("send abandoned", "outbox_id", id, "error", context.Cause(ctx))
		return pending, nil
	}
	p.m.SendsCut.Inc()
	p.cutMu.Lock()
	if len(p.cuts) > maxTrackedCuts {
		clear(p.cuts)
	}
	p.cuts[id]++
	n := p.cuts[id]
	if n >= 2 || unanswered {
		delete(p.cuts, id)
	}
	p.cutMu.Unlock()
	p.log.Warn("send cut short by the lease", "outbox_id", id, "times", n, "error", err)
	switch {
	case unanswered:
		return failed, fmt.Errorf("send cut short by the lock's trust deadline: the destination held it without a final answer: %w", err)
	case n < 2:
		return pending, nil
	}
	return failed, fmt.Errorf("send cut short by the lock's trust deadline %d times: the receiver answers slower than the lease allows: %w", n, err)
}

// maxTrackedCuts bounds the per-row memory of cut sends.
const maxTrackedCuts = 10000
