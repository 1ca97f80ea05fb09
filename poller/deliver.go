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

// deliver sends a batch's pending rows to the sink, per aggregate in id
// order: an aggregate stops at its first row not delivered (failed, cut,
// not attempted), and its later rows stay pending. Rows the batch holds
// refused or foreign stop their aggregate before anything is sent;
// delivered and poison rows do not block their aggregate.
//
// settle is told aggregates' rows (one slice per aggregate) once all of them
// have their final outcome: as soon as the sink reports an aggregate's last
// result (through dispatch.Batch.Done, or when Send returns), so an
// aggregate co-batched with a slow one need not wait for it. Results the
// sink reports for an aggregate after it stopped are not trusted: those
// rows stay pending. Whatever is not reached (the lease's trust deadline,
// the context, a sink that breaks its contract) is settled pending at the
// end: its claim is released.
func (p *Poller) deliver(ctx context.Context, items []item, token int64, trusted func() time.Time, settle func(aggs [][]int)) {
	d, queue := p.newDelivery(ctx, items, settle)
	d.settleWhere(func(a int) bool { return d.left[a] == 0 }) // nothing to send
	defer d.settleWhere(func(int) bool { return true })
	limit := p.sink.Capabilities().MaxBatch
	for len(queue) > 0 && ctx.Err() == nil && time.Now().Before(trusted()) {
		var chunk []int
		chunk, queue = d.nextChunk(queue, limit)
		if len(chunk) == 0 || !d.send(chunk, token, trusted) {
			return
		}
	}
}

// delivery is one batch's sends: its rows numbered by aggregate, what each
// aggregate still waits for, and which have settled. Results come from the
// sink's goroutines: mu guards the slices below it and items' outcomes.
// Its bookkeeping is a fixed number of allocations per batch, not one per
// aggregate or row.
type delivery struct {
	p      *Poller
	ctx    context.Context
	items  []item
	settle func(aggs [][]int)
	aggOf  []int   // by row: its aggregate's number, in order of first row
	rows   [][]int // by aggregate: every row of it

	mu       sync.Mutex
	left     []int  // by aggregate: rows queued without a result yet
	stopped  []bool // by aggregate
	settled  []bool // by aggregate
	answered []bool // by row
}

// newDelivery numbers items' aggregates and returns the delivery and the
// rows to send, in id order: pending rows of aggregates not stopped.
func (p *Poller) newDelivery(ctx context.Context, items []item, settle func(aggs [][]int)) (*delivery, []int) {
	aggOf, n := numberAggregates(items)
	d := &delivery{p: p, ctx: ctx, items: items, settle: settle, aggOf: aggOf,
		rows: make([][]int, n), left: make([]int, n), stopped: make([]bool, n), settled: make([]bool, n),
		answered: make([]bool, len(items))}
	// Every aggregate's rows in one array, sized once the aggregates are
	// counted.
	for _, a := range aggOf {
		d.left[a]++ // counting rows here; reset below
	}
	all := make([]int, len(items))
	for a, off := 0, 0; a < n; a++ {
		d.rows[a], off, d.left[a] = all[off:off:off+d.left[a]], off+d.left[a], 0
	}
	queue := make([]int, 0, len(items))
	for i := range items {
		a := aggOf[i]
		d.rows[a] = append(d.rows[a], i)
		switch items[i].outcome {
		case foreign, refused:
			d.stopped[a] = true
		case pending:
			if !d.stopped[a] {
				queue = append(queue, i)
				d.left[a]++
			}
		}
	}
	return d, queue
}

// numberAggregates numbers items' aggregates in order of first row: by row
// its aggregate's number, and how many there are.
func numberAggregates(items []item) (aggOf []int, n int) {
	aggOf = make([]int, len(items))
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
	return aggOf, len(number)
}

// nextChunk splits queue into the rows to send now (of aggregates not
// stopped, at most limit; 0: no limit) and the rest.
func (d *delivery) nextChunk(queue []int, limit int) (chunk, rest []int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, i := range queue {
		switch {
		case d.stopped[d.aggOf[i]]:
		case limit > 0 && len(chunk) == limit:
			rest = append(rest, i)
		default:
			chunk = append(chunk, i)
		}
	}
	return chunk, rest
}

// send sends chunk's rows as one sink batch and records their results. It
// returns false when the sink broke its contract (a wrong number of
// results): nothing of it is trusted.
func (d *delivery) send(chunk []int, token int64, trusted func() time.Time) bool {
	events := make([]dispatch.Event, len(chunk))
	for j, i := range chunk {
		r := d.items[i].row
		events[j] = dispatch.Event{ID: r.ID, AggregateType: r.AggregateType, AggregateID: r.AggregateID,
			EventType: r.EventType, Payload: r.Payload, Headers: r.Headers, CreatedAt: r.CreatedAt,
			Fingerprint: keys.MarkFingerprint(d.items[i].mark)} // the mark's text: no allocation
	}
	results := d.p.sink.Send(d.ctx, dispatch.Batch{Events: events, Token: token, Until: trusted,
		Done: func(j int, r dispatch.Result) {
			if j < 0 || j >= len(chunk) {
				return // a sink that breaks its contract
			}
			d.mu.Lock()
			defer d.mu.Unlock()
			if a := d.result(chunk[j], r); a >= 0 {
				d.settle([][]int{d.rows[a]})
			}
		}})
	if len(results) != len(chunk) {
		// A sink that breaks its contract: trust none of what it returned; claims are released.
		d.p.log.Error("sink returned a wrong number of results; nothing marked", "batch_size", len(chunk), "results", len(results))
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var done [][]int // settled now: told in one call
	for j, i := range chunk {
		if a := d.result(i, results[j]); a >= 0 {
			done = append(done, d.rows[a])
		}
	}
	if len(done) > 0 {
		d.settle(done)
	}
	return true
}

// result records row i's result; it returns the aggregate's number when
// that made the aggregate settled, else -1. d.mu held.
func (d *delivery) result(i int, r dispatch.Result) int {
	a := d.aggOf[i]
	if d.settled[a] || d.answered[i] {
		return -1
	}
	d.answered[i] = true
	if d.p.apply(d.ctx, &d.items[i], r) {
		d.left[a]--
	} else {
		d.stopped[a], d.left[a] = true, 0
	}
	if d.left[a] > 0 {
		return -1
	}
	d.settled[a] = true
	return a
}

// settleWhere settles, in one call, every aggregate not settled yet that
// want says is done.
func (d *delivery) settleWhere(want func(a int) bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var done [][]int
	for a := range d.rows {
		if !d.settled[a] && want(a) {
			d.settled[a] = true
			done = append(done, d.rows[a])
		}
	}
	if len(done) > 0 {
		d.settle(done)
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
