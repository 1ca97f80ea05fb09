package rabbitmq

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxd/outboxd/dispatch"
)

// unfiredDeadline is a context whose deadline has passed while its
// cancellation has not landed yet: what a sender frozen (GC, SIGSTOP) past
// its deadline sees when it resumes, before the runtime ran the context's
// timer. Only the write-time check can stop such a sender; with a real
// context the cancellation (which closes the connection) races it and
// hides its absence.
type unfiredDeadline struct {
	context.Context // cancelled at the test's end only
	at              time.Time
}

func (c unfiredDeadline) Deadline() (time.Time, bool) { return c.at, true }

// TestFrozenSenderPublishesNothingPastTheDeadline: the sender reads the
// clock for its last check before a publish (the deadline is ahead), then
// freezes until the deadline has passed; when it resumes, the connection
// refuses the write: nothing reaches the broker and the event is not
// delivered.
func TestFrozenSenderPublishesNothingPastTheDeadline(t *testing.T) {
	t.Parallel()
	a := newAdmin(t)
	a.declareExchange(amqp.ExchangeTopic)
	q := a.queue("#", nil)
	s := newSink(t, Config{Exchange: a.exchange})
	allDelivered(t, send(t, s, ev(1, "deal", "1", "x"))) // connected, channel set up
	a.drain(q)

	until := time.Now().Add(200 * time.Millisecond)
	calls, froze := 0, false
	s.now = func() time.Time {
		now := time.Now()
		if calls++; calls == 2 { // the first look is Send's, the second the publish's
			for d := time.Until(until); d >= 0; d = time.Until(until) {
				time.Sleep(d + time.Millisecond) // frozen with the clock read before the deadline
			}
			froze = true
		}
		return now
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Its deadline is just before until, so Send's own WithDeadline adds no
	// timer of its own either.
	ctx = unfiredDeadline{Context: ctx, at: until.Add(-time.Nanosecond)}
	res := s.Send(ctx, dispatch.Batch{Events: []dispatch.Event{ev(2, "deal", "1", "x")}, Token: 7,
		Until: func() time.Time { return until }})
	if !froze {
		t.Fatalf("the sender never reached the freeze point: %v (%v)", res[0].Outcome, res[0].Err)
	}
	if res[0].Outcome == dispatch.Delivered {
		t.Fatalf("a sender past its deadline published: %v (%s)", res[0].Outcome, res[0].Ref)
	}
	if !errors.Is(res[0].Err, errDeadlinePassed) {
		t.Errorf("result %v (%v), want the write refused by the deadline", res[0].Outcome, res[0].Err)
	}
	if n := a.count(q); n != 0 {
		t.Fatalf("queue holds %d messages from a sender past its deadline, want none", n)
	}
}
