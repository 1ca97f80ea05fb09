// Package nats is the NATS JetStream sink: nats.go's jetstream package,
// asynchronous publish of a batch with one acknowledgement per message,
// Nats-Msg-Id = outbox id for the stream's duplicate window (a duplicate ack
// counts as delivered). A subject no stream captures is a failure. It
// imports nothing of outboxd but dispatch.
package nats

import (
	"context"
	"errors"
	"log/slog"

	"github.com/outboxd/outboxd/dispatch"
)

// Defaults (the contract's) for Config's zero fields.
const (
	DefaultURL     = "nats://127.0.0.1:4222"
	DefaultSubject = "outbox.event.{aggregate_type}"
)

// Config configures the sink.
type Config struct {
	URL         string               // DefaultURL when empty
	Subject     string               // template; DefaultSubject when empty
	CredsFile   string               // optional user credentials file
	CloudEvents dispatch.CloudEvents // ce- headers
	Log         *slog.Logger         // optional
}

// Sink publishes batches to JetStream. Create with New; Close when done.
type Sink struct{}

// New validates cfg and returns the sink. It does not wait for the server:
// an unreachable server makes sends fail (retryable), never New.
func New(cfg Config) (*Sink, error) {
	return nil, errors.New("nats: sink not implemented yet")
}

// Send implements dispatch.Sink.
func (s *Sink) Send(ctx context.Context, b dispatch.Batch) []dispatch.Result {
	return make([]dispatch.Result, len(b.Events))
}

// Capabilities implements dispatch.Sink.
func (s *Sink) Capabilities() dispatch.Capabilities { return dispatch.Capabilities{} }

// Close disconnects.
func (s *Sink) Close() error { return nil }
