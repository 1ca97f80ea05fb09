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
// 512 keeps a receiver answering in 20 ms (another region) above 10k ev/s
// with room to spare (docs/operations.md, "Slow receivers").
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
	out := make([]Result, len(b.Events))
	var wg sync.WaitGroup
	for _, idx := range byAggregate(b.Events) {
		select {
		case p.slots <- struct{}{}:
		case <-ctx.Done():
			notAttempted(b, idx) // this aggregate's events stay NotAttempted
			continue
		}
		wg.Go(func() {
			defer func() { <-p.slots }()
			p.sendAggregate(ctx, b, idx, out)
		})
	}
	wg.Wait()
	return out
}

// sendAggregate sends the events at idx (one aggregate's, in order) until
// the first that does not go through.
func (p *perEvent) sendAggregate(ctx context.Context, b Batch, idx []int, out []Result) {
	for k, i := range idx {
		// Trust the lease less than Redis does: past the local deadline (a
		// pause, a slow network) stop without waiting to hear from Redis.
		until := b.Until()
		if ctx.Err() != nil || !time.Now().Before(until) {
			notAttempted(b, idx[k:]) // the rest stay NotAttempted
			return
		}
		sctx, cancel := context.WithDeadline(ctx, until)
		start := time.Now()
		err := p.send(sctx, b.Events[i], b.Token)
		took := time.Since(start)
		err = WithDuration(err, took)
		// Read before cancel, which sets it. Past the deadline the webhook
		// refuses to write (ErrDeadlinePassed), maybe before the context's
		// timer fired: that is the deadline's doing too, not the receiver's.
		cut := sctx.Err() != nil || !time.Now().Before(until)
		cancel()
		if err != nil {
			out[i] = Failed(err)
			out[i].Cut = cut
			b.sent(i, out[i], took)
			b.done(i, out[i])
			notAttempted(b, idx[k+1:])
			return
		}
		out[i].Outcome = Delivered
		b.sent(i, out[i], took)
		b.done(i, out[i])
	}
}

// notAttempted reports the events at idx as NotAttempted to b.Done.
func notAttempted(b Batch, idx []int) {
	for _, i := range idx {
		b.done(i, Result{Outcome: NotAttempted})
	}
}

// byAggregate groups event indexes by aggregate, each group in event order,
// groups in order of first appearance.
func byAggregate(events []Event) [][]int {
	pos := map[Aggregate]int{}
	var groups [][]int
	for i, ev := range events {
		k := ev.Aggregate()
		g, ok := pos[k]
		if !ok {
			g = len(groups)
			pos[k] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}
