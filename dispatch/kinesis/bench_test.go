package kinesis

import (
	"strconv"
	"testing"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/internal/sinktest"
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
	s := newSink(b, k, Config{})
	const total, size = 10000, 1000
	events := make([]dispatch.Event, total)
	for i := range events {
		events[i] = sinktest.Event(int64(i+1), "bench", strconv.Itoa(i%1000))
	}
	b.ResetTimer()
	for b.Loop() {
		for off := 0; off < total; off += size {
			for i, r := range s.Send(b.Context(), sinktest.Batch(events[off:off+size]...)) {
				if r.Outcome != dispatch.Delivered {
					b.Fatalf("event %d: %s %v", events[off+i].ID, r.Outcome, r.Err)
				}
			}
		}
	}
	b.ReportMetric(float64(total*b.N)/b.Elapsed().Seconds(), "events/s")
}
