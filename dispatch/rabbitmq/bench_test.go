package rabbitmq

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxd/outboxd/dispatch"
)

// BenchmarkSend10k: 10,000 events of ~100 bytes over 200 aggregates, in
// batches of 500 (the poller's default batch size), persistent, to one
// durable queue on the local broker; reports events/s.
//
//	go test -run '^$' -bench Send10k -benchtime 5x ./dispatch/rabbitmq/
func BenchmarkSend10k(b *testing.B) {
	a := newAdmin(b)
	a.declareExchange(amqp.ExchangeTopic)
	q := a.queue("#", nil)
	s := newSink(b, Config{Exchange: a.exchange})
	const total, size = 10000, 500
	events := make([]dispatch.Event, total)
	for i := range events {
		events[i] = ev(int64(i+1), "deal", strconv.Itoa(i%200), "deal.updated")
		events[i].Payload = json.RawMessage(fmt.Sprintf(`{"deal":%d,"amount":%d,"currency":"EUR","note":"benchmark event payload"}`, i%200, i))
	}
	var elapsed time.Duration
	for b.Loop() {
		start := time.Now()
		for lo := 0; lo < total; lo += size {
			for i, r := range s.Send(context.Background(), batchOf(events[lo:lo+size]...)) {
				if r.Outcome != dispatch.Delivered {
					b.Fatalf("event %d: %v %v", lo+i, r.Outcome, r.Err)
				}
			}
		}
		elapsed += time.Since(start)
		b.StopTimer()
		if _, err := a.ch.QueuePurge(q, false); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(total*b.N)/elapsed.Seconds(), "events/s")
}
