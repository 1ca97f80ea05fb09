// Package redisstream is the Redis Streams sink: one pipelined XADD per
// batch with a reply per entry, approximate MAXLEN trimming, the stream key
// from a template. Redis 7 has no server-side dedupe: consumers dedupe on
// the id field. It imports nothing of outboxd but dispatch.
package redisstream

import (
	"context"
	"errors"
	"log/slog"

	"github.com/redis/go-redis/v9"

	"github.com/outboxd/outboxd/dispatch"
)

// Defaults (the contract's) for Config's zero fields.
const (
	DefaultStream = "outbox.event.{aggregate_type}"
	DefaultMaxLen = 1000000 // approximate (MAXLEN ~)
)

// Config configures the sink.
type Config struct {
	Client      redis.UniversalClient // where the streams live (the lock's Redis by default)
	Stream      string                // template; DefaultStream when empty
	MaxLen      int64                 // approximate trim length; 0 = no trimming
	KeyPrefix   string                // put before every stream key (redis.key_prefix)
	CloudEvents dispatch.CloudEvents  // ce- fields
	Log         *slog.Logger          // optional
}

// Sink appends batches to Redis streams. Create with New.
type Sink struct{}

// New validates cfg and returns the sink.
func New(cfg Config) (*Sink, error) {
	return nil, errors.New("redisstream: sink not implemented yet")
}

// Send implements dispatch.Sink.
func (s *Sink) Send(ctx context.Context, b dispatch.Batch) []dispatch.Result {
	return make([]dispatch.Result, len(b.Events))
}

// Capabilities implements dispatch.Sink.
func (s *Sink) Capabilities() dispatch.Capabilities { return dispatch.Capabilities{} }
