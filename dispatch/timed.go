package dispatch

import (
	"context"
	"sync/atomic"
	"time"
)

// Send outcomes, the values SendOutcome returns (a metric's label).
const (
	SendDelivered = "delivered" // delivered, or a duplicate the destination already had
	SendRetryable = "retryable"
	SendPermanent = "permanent"
	SendCut       = "cut" // cut by the trust deadline or the caller's context
)

// SendOutcomes lists every value SendOutcome returns.
var SendOutcomes = []string{SendDelivered, SendRetryable, SendPermanent, SendCut}

// SendOutcome names r's outcome for a send that was attempted.
func SendOutcome(r Result) string {
	switch {
	case r.Outcome == Delivered || r.Outcome == Duplicate:
		return SendDelivered
	case r.Cut:
		return SendCut
	case r.Outcome == Permanent:
		return SendPermanent
	}
	return SendRetryable
}

// Timed wraps s so that observe learns the duration and outcome
// (SendOutcome) of each send: for a sink that sends events one by one
// (it reports Batch.Sent), each event's own request; for a sink that
// sends the batch at once, the whole call, observed once, with the outcome
// of its first event that did not go through (delivered when all did). A
// call in which no event was attempted is not observed. observe may be
// called from several goroutines at once. Results and everything else of
// s are unchanged.
func Timed(s Sink, observe func(outcome string, took time.Duration)) Sink {
	return &timed{inner: s, observe: observe}
}

type timed struct {
	inner   Sink
	observe func(outcome string, took time.Duration)
}

func (t *timed) Capabilities() Capabilities { return t.inner.Capabilities() }

// Close closes the inner sink, if it has anything to close.
func (t *timed) Close() error {
	if c, ok := t.inner.(interface{ Close() error }); ok {
		return c.Close()
	}
	return nil
}

// Unwrap is the inner sink.
func (t *timed) Unwrap() Sink { return t.inner }

func (t *timed) Send(ctx context.Context, b Batch) []Result {
	var perEvent atomic.Bool
	inner := b
	inner.Sent = func(i int, r Result, took time.Duration) {
		perEvent.Store(true)
		t.observe(SendOutcome(r), took)
		if b.Sent != nil {
			b.Sent(i, r, took)
		}
	}
	start := time.Now()
	out := t.inner.Send(ctx, inner)
	took := time.Since(start)
	if perEvent.Load() {
		return out
	}
	attempted, outcome := false, SendDelivered
	for _, r := range out {
		if r.Outcome == NotAttempted {
			continue
		}
		attempted = true
		if o := SendOutcome(r); o != SendDelivered {
			outcome = o
			break
		}
	}
	if attempted {
		t.observe(outcome, took)
	}
	return out
}
