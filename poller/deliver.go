package poller

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/outboxd/outboxd/dispatch"
)

// delivered and poison rows do not block their aggregate.
//
// settle is told each aggregate's rows once all of them have their final
// outcome: as soon as the sink reports the aggregate's last result (through
// dispatch.Batch.Done, or when Send returns), so an aggregate co-batched
// with a slow one need not wait for it. Results the sink reports for an
// aggregate after it stopped are not trusted: those rows stay pending.
func (p *Poller) deliver(ctx context.Context, items []item, token int64, trusted func() time.Time, settle func(idx []int)) {
	type aggKey struct{ t, id string }
	agg := func(i int) aggKey { return aggKey{items[i].row.AggregateType, items[i].row.AggregateID} }
	var mu sync.Mutex          // the maps below, and items' outcomes: results come from the sink's goroutines
	rows := map[aggKey][]int{} // every row, per aggregate
	var aggs []aggKey          // in order of first row
	left := map[aggKey]int{}   // rows queued without a result yet
	stopped := map[aggKey]bool{}
	settled := map[aggKey]bool{}
	answered := map[int]bool{}
	var queue []int // rows to send, id order
	for i := range items {
		a := agg(i)
		if rows[a] == nil {
			aggs = append(aggs, a)
		}
		rows[a] = append(rows[a], i)
		switch items[i].outcome {
		case foreign, refused:
			stopped[a] = true
		case pending:
			if !stopped[a] {
				queue = append(queue, i)
				left[a]++
			}
		}
	}
	done := func(a aggKey) { // mu held
		if !settled[a] {
			settled[a] = true
			settle(rows[a])
		}
	}
	result := func(i int, r dispatch.Result) { // mu held
		a := agg(i)
		if settled[a] || answered[i] {
			return
		}
		answered[i] = true
		if p.apply(ctx, &items[i], r) {
			left[a]--
		} else {
			stopped[a], left[a] = true, 0
		}
		if left[a] == 0 {
			done(a)
		}
	}
	mu.Lock()
	for _, a := range aggs {
		if left[a] == 0 {
			done(a) // nothing to send
		}
	}
	mu.Unlock()
	defer func() {
		// Whatever was not reached stays pending: its claim is released.
		mu.Lock()
		for _, a := range aggs {
			done(a)
		}
		mu.Unlock()
	}()
	limit := p.sink.Capabilities().MaxBatch
	for len(queue) > 0 && ctx.Err() == nil && time.Now().Before(trusted()) {
		var chunk, rest []int
		mu.Lock()
		for _, i := range queue {
			switch {
			case stopped[agg(i)]:
			case limit > 0 && len(chunk) == limit:
				rest = append(rest, i)
			default:
				chunk = append(chunk, i)
			}
		}
		mu.Unlock()
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
		results := p.sink.Send(ctx, dispatch.Batch{Events: events, Token: token, Until: trusted,
			Done: func(j int, r dispatch.Result) {
				if j < 0 || j >= len(chunk) {
					return // a sink that breaks its contract
				}
				mu.Lock()
				result(chunk[j], r)
				mu.Unlock()
			}})
		if len(results) != len(chunk) {
			// A sink that breaks its contract: trust none of what it returned; claims are released.
			p.log.Error("sink returned a wrong number of results; nothing marked", "batch_size", len(chunk), "results", len(results))
			return
		}
		mu.Lock()
		for j, i := range chunk {
			result(i, results[j])
		}
		mu.Unlock()
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
			it.outcome, it.err = p.cutShort(ctx, it.row.ID, err)
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
// retrying forever without ever dead-lettering.
func (p *Poller) cutShort(ctx context.Context, id int64, err error) (outcome, error) {
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
	if n >= 2 {
		delete(p.cuts, id)
	}
	p.cutMu.Unlock()
	p.log.Warn("send cut short by the lease", "outbox_id", id, "times", n, "error", err)
	if n < 2 {
		return pending, nil
	}
	return failed, fmt.Errorf("send cut short by the lock's trust deadline %d times: the receiver answers slower than the lease allows: %w", n, err)
}

// maxTrackedCuts bounds the per-row memory of cut sends.
const maxTrackedCuts = 10000
