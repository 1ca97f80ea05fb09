// Package rabbitmq is the RabbitMQ sink: amqp091-go with publisher
// confirms, persistent messages, MessageId = outbox id, and mandatory
// publishing with returns matched by message id, so an unroutable message
// is a failure, never a success. It imports nothing of outboxd but
// dispatch.
package rabbitmq

import (
	"context"
	"errors"
	"log/slog"

	"github.com/outboxd/outboxd/dispatch"
)

// Defaults (the contract's) for Config's zero fields.
const (
	DefaultURL        = "amqp://guest:guest@127.0.0.1:5672/"
	DefaultExchange   = "outbox" // a durable topic exchange, declared if missing
	DefaultRoutingKey = "outbox.event.{aggregate_type}"
)

// Config configures the sink.
type Config struct {
	URL         string               // DefaultURL when empty
	Exchange    string               // DefaultExchange when empty
	RoutingKey  string               // template; DefaultRoutingKey when empty
	CloudEvents dispatch.CloudEvents // ce- headers
	Log         *slog.Logger         // optional
}

// Sink publishes batches to RabbitMQ. Create with New; Close when done.
type Sink struct{}

// New validates cfg and returns the sink. It does not wait for the broker:
// an unreachable broker makes sends fail (retryable), never New.
func New(cfg Config) (*Sink, error) {
	return nil, errors.New("rabbitmq: sink not implemented yet")
}

// Send implements dispatch.Sink.
func (s *Sink) Send(ctx context.Context, b dispatch.Batch) []dispatch.Result {
	return make([]dispatch.Result, len(b.Events))
}

// Capabilities implements dispatch.Sink.
func (s *Sink) Capabilities() dispatch.Capabilities { return dispatch.Capabilities{} }

// Close disconnects.
func (s *Sink) Close() error { return nil }
