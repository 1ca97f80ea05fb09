package poller

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/internal/keys"
	"github.com/outboxd/outboxd/store"
)

// delivered and poison rows do not block their aggregate.
//
// settle is told aggregates' rows (one slice per aggregate) once all of them
// have their final outcome: as soon as the sink reports an aggregate's last
// result (through dispatch.Batch.Done, or when Send returns), so an
// aggregate co-batched with a slow one need not wait for it. Results the
// sink reports for an aggregate after it stopped are not trusted: those
// rows stay pending.
func (p *Poller) deliver(ctx context.Context, items []item, token int64, trusted func() time.Time, settle func(aggs [][]int)) {
	// Aggregates by number, in order of first row; the slices below by that number.
	aggOf := make([]int, len(items))
	number := make(map[store.Aggregate]int, len(items))
	for i := range items {
		k := aggregateOf(items[i])
		a, ok := number[k]
		if !ok {
			a = len(number)
			number[k] = a
		}
		aggOf[i] = a
	}
	// Sized once the aggregates are counted, every aggregate's rows in one
	// array: grown by append, they were an allocation per aggregate and a
	// fifth of deliver's allocated bytes.
	n := len(number)
	rows := make([][]int, n) // every row of each aggregate
	left := make([]int, n)   // rows queued without a result yet
	for _, a := range aggOf {
		left[a]++ // counting rows here; reset below
	}
	all := make([]int, len(items))
	for a, off := 0, 0; a < n; a++ {
		rows[a], off, left[a] = all[off:off:off+left[a]], off+left[a], 0
	}
	stopped, settled := make([]bool, n), make([]bool, n)
	answered := make([]bool, len(items))
	var mu sync.Mutex                   // the slices above, and items' outcomes: results come from the sink's goroutines
	queue := make([]int, 0, len(items)) // rows to send, id order
	for i := range items {
		a := aggOf[i]
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
	// result records row i's result; it returns the aggregate's number when
	// that made the aggregate settled, else -1. mu held.
	result := func(i int, r dispatch.Result) int {
		a := aggOf[i]
		if settled[a] || answered[i] {
			return -1
		}
		answered[i] = true
		if p.apply(ctx, &items[i], r) {
			left[a]--
		} else {
			stopped[a], left[a] = true, 0
		}
		if left[a] > 0 {
			return -1
		}
		settled[a] = true
		return a
	}
	// settleAll settles every aggregate that want says is done; mu held.
	settleAll := func(want func(a int) bool) {
		var done [][]int
		for a := range rows {
			if !settled[a] && want(a) {
				settled[a] = true
				done = append(done, rows[a])
			}
		}
		if len(done) > 0 {
			settle(done)
		}
	}
	mu.Lock()
	settleAll(func(a int) bool { return left[a] == 0 }) // nothing to send
	mu.Unlock()
	defer func() {
		// Whatever was not reached stays pending: its claim is released.
		mu.Lock()
		settleAll(func(int) bool { return true })
		mu.Unlock()
	}()
	limit := p.sink.Capabilities().MaxBatch
	for len(queue) > 0 && ctx.Err() == nil && time.Now().Before(trusted()) {
		var chunk, rest []int
		mu.Lock()
		for _, i := range queue {
			switch {
			case stopped[aggOf[i]]:
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
				EventType: r.EventType, Payload: r.Payload, Headers: r.Headers, CreatedAt: r.CreatedAt,
				Fingerprint: keys.MarkFingerprint(items[i].mark)} // the mark's text: no allocation
		}
		results := p.sink.Send(ctx, dispatch.Batch{Events: events, Token: token, Until: trusted,
			Done: func(j int, r dispatch.Result) {
				if j < 0 || j >= len(chunk) {
					return // a sink that breaks its contract
				}
				mu.Lock()
				defer mu.Unlock()
				if a := result(chunk[j], r); a >= 0 {
					settle([][]int{rows[a]})
				}
			}})
		if len(results) != len(chunk) {
			// A sink that breaks its contract: trust none of what it returned; claims are released.
			p.log.Error("sink returned a wrong number of results; nothing marked", "batch_size", len(chunk), "results", len(results))
			return
		}
		mu.Lock()
		var done [][]int // settled now: told in one call
		for j, i := range chunk {
			if a := result(i, results[j]); a >= 0 {
				done = append(done, rows[a])
			}
		}
		if len(done) > 0 {
			settle(done)
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
