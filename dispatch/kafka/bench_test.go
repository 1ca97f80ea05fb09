package kafka

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/dispatch"
)

// BenchmarkSend produces 10,000 events in batches of 500 (100 aggregates,
// a 3-partition topic), each batch waiting for its acks, and reports
// events/s: against kfake in this process, and against
// OUTBOXD_TEST_KAFKA_BROKERS when set.
//
//	go test -run '^$' -bench Send -benchtime 10x ./dispatch/kafka/
func BenchmarkSend(b *testing.B) {
	b.Run("kfake", func(b *testing.B) { benchSend(b, nil) })
	b.Run("real", func(b *testing.B) {
		brokers := os.Getenv(realBrokersEnv)
		if brokers == "" {
			b.Skip(realBrokersEnv + " not set")
		}
		benchSend(b, strings.Split(brokers, ","))
	})
}

func benchSend(b *testing.B, brokers []string) {
	var c *cluster
	if brokers == nil {
		c = newFake(b)
	} else {
		c = newCluster(b, brokers, nil)
	}
	topic := c.topic("bench")
	c.create(3, topic)
	s := c.sink(c.prefix + ".{aggregate_type}")
	const total, size = 10000, 500
	events := make([]dispatch.Event, total)
	for i := range events {
		events[i] = event(int64(i+1), "bench", strconv.Itoa(i%100))
	}
	b.ResetTimer()
	for b.Loop() {
		for off := 0; off < total; off += size {
			for i, r := range s.Send(b.Context(), batch(events[off:off+size]...)) {
				if r.Outcome != dispatch.Delivered {
					b.Fatalf("event %d: %s %v", events[off+i].ID, r.Outcome, r.Err)
				}
			}
		}
	}
	b.ReportMetric(float64(total*b.N)/b.Elapsed().Seconds(), "events/s")
}
