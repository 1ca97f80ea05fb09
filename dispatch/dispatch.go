// Package dispatch delivers outbox events to a sink. It imports nothing of
// outboxd: callers convert their rows to Event.
//
// A Sink returns nil when the event was delivered, or an error. Errors are
// retryable unless marked permanent (see Permanent); a sink can ask for a
// minimum delay before the next attempt (see RetryAfter).
package dispatch

import (
	"context"
	"encoding/json"
	"errors"
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
}

// Sink delivers one event. token is the sender's fencing token, passed on so
// receivers can refuse a stale sender.
type Sink interface {
	Send(ctx context.Context, ev Event, token int64) error
}

// Error is a failed delivery with the sink's advice.
type Error struct {
	Err        error
	Permanent  bool          // retrying will not help: dead-letter now
	RetryAfter time.Duration // the receiver asked to wait at least this long
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

// Noop accepts every event without sending it anywhere (benchmarks, dry runs).
type Noop struct{}

// Send implements Sink.
func (Noop) Send(context.Context, Event, int64) error { return nil }
