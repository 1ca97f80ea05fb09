package pubsub

import (
	"testing"

	"github.com/outboxd/outboxd/dispatch/internal/sinktest"
)

// BenchmarkSend publishes 10,000 events in batches of 1,000 over 1,000
// aggregates (the drain's shape: one publish request per batch) to pstest
// in this process over gRPC, and reports events/s: the sink and the
// emulator alone, no Postgres, no claims.
//
//	go test -run '^$' -bench Send -benchtime 3x ./dispatch/pubsub/
func BenchmarkSend(b *testing.B) {
	e := newEmulator(b, "outbox.event.bench")
	sinktest.BenchSend(b, e.sink(Config{}), "bench")
}
