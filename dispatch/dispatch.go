// Package dispatch delivers outbox events to a sink. It imports nothing of
// outboxd: callers convert their rows to Event.
//
// A Sink takes an ordered batch and answers per event (Result), aligned by
// index. Per aggregate, successes are a prefix: after an aggregate's first
// failure its later events are NotAttempted, so the caller never marks an
// event delivered while an earlier one of its aggregate is to be retried.
// No send starts after the batch's trust deadline (Batch.Until).
package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"time"
)

// Event is what a sink delivers.
type Event struct {
	ID            int64           `json:"id"`
	AggregateType string          `json:"aggregate_type"`
	AggregateID   string          `json:"aggregate_id"`
	EventType     string          `json:"event_type"`
	Payload       json.RawMessage `json:"payload"`
	Headers       json.RawMessage `json:"headers"`
	CreatedAt     time.Time       `json:"created_at"`
	// Fingerprint tells this row from another that had the same ID (the
	// ids came round again, or a producer wrote a row again with another
	// payload): the caller's, the same text its idempotency mark names. It
	// is part of DedupeID, never of the message itself. Empty: the ID
	// alone names the row.
	Fingerprint string `json:"-"`
}

// DedupeID is the key a broker that deduplicates (JetStream's Nats-Msg-Id,
// an SQS or SNS FIFO MessageDeduplicationId) drops a repeat by:
// "<id>:<fingerprint>". The same row sent twice has the same one, so the
// broker stores it once; a new row that reuses the id has another, so no
// dedupe window swallows it.
func (ev Event) DedupeID() string {
	id := strconv.FormatInt(ev.ID, 10)
	if ev.Fingerprint == "" {
		return id
	}
	return id + ":" + ev.Fingerprint
}

// Aggregate is the unit of ordering: events of one aggregate are delivered
// in id order.
type Aggregate struct{ Type, ID string }

// Aggregate is the event's aggregate.
func (ev Event) Aggregate() Aggregate { return Aggregate{ev.AggregateType, ev.AggregateID} }

// Batch is one call's worth of events.
type Batch struct {
	// Events in id order; the events of one aggregate in their order.
	Events []Event
	// Token is the sender's fencing token, passed on so destinations can
	// refuse a stale sender.
	Token int64
	// Until returns the lease's local trust deadline now (it moves forward
	// as the lease is renewed). A sink starts no send past it and bounds
	// each send by it; a sink that sends the batch at once bounds the call.
	Until func() time.Time
	// Done, if set, is told each event's result as soon as it is final,
	// before Send returns: the caller learns that an aggregate is finished
	// while slower ones are still being sent. A sink that sends events one
	// by one (PerEvent) calls it once per event, from any goroutine, with
	// the Result it will also return; a sink that sends the batch at once
	// may ignore it (the caller reads what Send returns). One aggregate's
	// results come in its order: an event's never before an earlier
	// event's of its aggregate (the caller counts an aggregate finished at
	// its first event not delivered). It must be cheap.
	Done func(i int, r Result)
	// Sent, if set, is told how long each event's own send took (the
	// request alone, not the wait behind earlier events of its aggregate),
	// with its result, right before Done. Only a sink that sends events
	// one by one (PerEvent) calls it; a sink that sends the batch at once
	// does not (see Timed). It must be cheap and safe for concurrent use.
	Sent func(i int, r Result, took time.Duration)
}

// sent reports event i's send to b.Sent, if set.
func (b Batch) sent(i int, r Result, took time.Duration) {
	if b.Sent != nil {
		b.Sent(i, r, took)
	}
}

// done reports event i's result to b.Done, if set.
func (b Batch) done(i int, r Result) {
	if b.Done != nil {
		b.Done(i, r)
	}
}

// Window bounds ctx by the batch's trust deadline as it is now. ok is
// false when ctx has ended or the deadline has passed: then nothing may be
// sent, and every event stays NotAttempted. Call cancel either way.
func (b Batch) Window(ctx context.Context) (_ context.Context, cancel context.CancelFunc, ok bool) {
	until := b.Until()
	ok = ctx.Err() == nil && time.Now().Before(until)
	ctx, cancel = context.WithDeadline(ctx, until)
	return ctx, cancel, ok
}

// Outcome is what became of one event.
type Outcome uint8

const (
	NotAttempted Outcome = iota // not sent: an earlier event of its aggregate failed, or the deadline came first
	Delivered                   // the destination acknowledged it
	Duplicate                   // the destination already had it (its dedupe window): counts as delivered
	Retryable                   // failed; try again later
	Permanent                   // failed; retrying cannot help: dead-letter
)

func (o Outcome) String() string {
	return [...]string{"not attempted", "delivered", "duplicate", "retryable", "permanent"}[o]
}

// Result is one event's outcome.
type Result struct {
	Outcome Outcome
	// Ref is the destination's reference to the message (partition/offset,
	// stream sequence, entry id), for logs; may be empty.
	Ref string
	// Err says why, for Retryable and Permanent.
	Err error
	// RetryAfter is the destination's requested minimum delay (Retryable).
	RetryAfter time.Duration
	// Cut: Retryable because the send was cut by the trust deadline or the
	// context, not by the destination.
	Cut bool
	// Unanswered: the message reached the destination's connection and no
	// final answer came back on it (a held socket, an interim or
	// protocol-switching answer). With Cut, the destination held the send
	// until the deadline: the caller counts that as an attempt at once.
	Unanswered bool
}

// Capabilities tell the caller how to use a sink safely.
type Capabilities struct {
	// MaxBatch is the most events per Send; 0 means no limit.
	MaxBatch int
	// Parallel is how many aggregates the sink sends at once across all its
	// Send calls (a per-event sink's concurrency); 0 when it takes a batch
	// as a whole. The poller keeps about that many aggregates in flight.
	Parallel int
	// DedupeWindow is how long the destination drops a repeated event
	// (Event.DedupeID: NATS JetStream's duplicate window, SQS and SNS FIFO's
	// five minutes); 0 means it does not, and consumers dedupe on the id. A
	// retry after the window is a duplicate.
	DedupeWindow time.Duration
	// Ordering says where the order of one aggregate's events is kept, e.g.
	// "per aggregate (HTTP requests in order)", "per partition (key =
	// aggregate_id)".
	Ordering string
}

// Sink delivers batches of events.
type Sink interface {
	// Send delivers b and returns one Result per event, aligned by index.
	Send(ctx context.Context, b Batch) []Result
	Capabilities() Capabilities
}

// Error is a failed delivery with the sink's advice; SendFunc returns it.
type Error struct {
	Err        error
	Status     int           // the receiver's HTTP status (webhook); 0 for none
	Permanent  bool          // retrying will not help: dead-letter now
	RetryAfter time.Duration // the receiver asked to wait at least this long
	Unanswered bool          // written, and no final answer came (Result.Unanswered)
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// IsPermanent reports whether err says retrying cannot succeed.
func IsPermanent(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Permanent
}

// RetryAfter returns the receiver's requested delay, 0 if none.
func RetryAfter(err error) time.Duration {
	var e *Error
	if errors.As(err, &e) {
		return e.RetryAfter
	}
	return 0
}

// Failed is the Result for err: Permanent or Retryable (with its
// RetryAfter) as err says.
func Failed(err error) Result {
	if IsPermanent(err) {
		return Result{Outcome: Permanent, Err: err}
	}
	r := Result{Outcome: Retryable, Err: err, RetryAfter: RetryAfter(err)}
	var e *Error
	r.Unanswered = errors.As(err, &e) && e.Unanswered
	return r
}

// Noop accepts every event without sending it anywhere (benchmarks, dry runs).
type Noop struct{}

// Send implements Sink: every event Delivered.
func (Noop) Send(_ context.Context, b Batch) []Result {
	out := make([]Result, len(b.Events))
	for i := range out {
		out[i].Outcome = Delivered
	}
	return out
}

// Capabilities implements Sink.
func (Noop) Capabilities() Capabilities {
	return Capabilities{Ordering: "none needed (nothing is sent)"}
}
