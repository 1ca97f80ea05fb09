package dispatch

import (
	"cmp"
	"context"
	"sync"
	"time"
)

// SendFunc delivers one event: nil when delivered, otherwise an error that
// IsPermanent and RetryAfter classify.
type SendFunc func(ctx context.Context, ev Event, token int64) error

// DefaultConcurrency is how many aggregates a PerEvent sink sends at once
// when asked for 0: throughput is about concurrency / receiver latency, and
// the default leaves room for a receiver in another region before its
// latency, not the relay, sets the pace (docs/operations.md, "Slow
// receivers"; the figures are in BENCHMARKS.md).
const DefaultConcurrency = 512

// PerEvent makes a Sink of a destination that takes one event per request
// (the webhook). It sends aggregates in parallel, at most concurrency at
// once across all its Send calls (several batches may be in flight: the
// bound is the sink's, not the call's), and the events of one aggregate one
// after another in order, stopping an aggregate at its first failure: its
// later events are NotAttempted. Each event's result goes to Batch.Done as
// soon as it is known. It reads the trust deadline before every send,
// starts none past it and bounds each by it; a send that fails after its
// deadline or context ended is reported Cut. Its Capabilities' Parallel is
// the concurrency.
func PerEvent(send SendFunc, concurrency int, caps Capabilities) Sink {
	caps.Parallel = cmp.Or(concurrency, DefaultConcurrency)
	return &perEvent{send: send, slots: make(chan struct{}, caps.Parallel), caps: caps}
}

type perEvent struct {
	send  SendFunc
	slots chan struct{} // one per aggregate being sent, across Send calls
	caps  Capabilities
}

func (p *perEvent) Capabilities() Capabilities { return p.caps }

func (p *perEvent) Send(ctx context.Context, b Batch) []Result {
	d := &deadlines{parent: ctx}
	defer d.release()
	r := NewRounds(b.Events)
	r.Parallel(ctx, p.slots, func(i int) Result { return p.sendOne(ctx, d, b, i) },
		func(i int) { b.done(i, Result{Outcome: NotAttempted}) })
	return r.Results()
}

// deadlines gives the sends of one Send call a context ending at the trust
// deadline each read: one context per deadline (the lease moves it at each
// renewal), shared by the sends that read it, rather than a context and a
// timer per event. All end when the call returns.
type deadlines struct {
	parent  context.Context
	mu      sync.Mutex
	until   time.Time
	ctx     context.Context // nil until the first send
	cancels []context.CancelFunc
}

// at returns a context ending at until.
func (d *deadlines) at(until time.Time) context.Context {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ctx == nil || !until.Equal(d.until) {
		ctx, cancel := context.WithDeadline(d.parent, until)
		d.until, d.ctx = until, ctx
		d.cancels = append(d.cancels, cancel)
	}
	return d.ctx
}

func (d *deadlines) release() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, cancel := range d.cancels {
		cancel()
	}
}

// sendOne sends event i and reports its result to b.Sent and b.Done; it
// sends nothing once ctx or the trust deadline has ended (NotAttempted).
func (p *perEvent) sendOne(ctx context.Context, d *deadlines, b Batch, i int) Result {
	// Trust the lease less than Redis does: past the local deadline (a
	// pause, a slow network) stop without waiting to hear from Redis.
	until := b.Until()
	if ctx.Err() != nil || !time.Now().Before(until) {
		b.done(i, Result{Outcome: NotAttempted})
		return Result{Outcome: NotAttempted}
	}
	sctx := d.at(until)
	start := time.Now()
	err := p.send(sctx, b.Events[i], b.Token)
	took := time.Since(start)
	err = WithDuration(err, took)
	// Past the deadline the webhook refuses to write (ErrDeadlinePassed),
	// maybe before the context's timer fired: that is the deadline's doing
	// too, not the receiver's.
	cut := sctx.Err() != nil || !time.Now().Before(until)
	res := Result{Outcome: Delivered}
	if err != nil {
		res = Failed(err)
		res.Cut = cut
	}
	b.sent(i, res, took)
	b.done(i, res)
	return res
}
