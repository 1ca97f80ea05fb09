package kinesis

import (
	"testing"

	"github.com/outboxd/outboxd/dispatch/internal/sinktest"
	"github.com/outboxd/outboxd/internal/testenv"
)

// BenchmarkSend writes 10,000 events in batches of 1,000 over 1,000
// aggregates (the drain's shape: two PutRecords calls per batch) to a
// 4-shard stream on kinesalite, and reports events/s: the sink and the
// emulator alone, no Postgres, no claims.
//
//	go test -run '^$' -bench Send -benchtime 3x ./dispatch/kinesis/
func BenchmarkSend(b *testing.B) {
	k := testenv.StartKinesalite(b)
	createStream(b, k, "outbox.event.bench", 4)
	sinktest.BenchSend(b, newSink(b, k, Config{}), "bench")
}
