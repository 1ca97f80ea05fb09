package traced_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/dispatch/kafka"
	"github.com/outboxd/outboxd/dispatch/traced"
)

// A broker sink puts the row's headers on its messages: wrapped, a Kafka
// record (kfake) carries the send span's traceparent and the row's
// tracestate as record headers, once each.
func TestKafkaRecordCarriesTheSendSpan(t *testing.T) {
	fake, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "outbox.deal"))
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Close()
	k, err := kafka.New(kafka.Config{Brokers: fake.ListenAddrs(), Topic: "outbox.{aggregate_type}"})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	s := traced.Wrap(k, tp, traced.Options{System: "kafka"})
	ev := event(41, "42", `{"traceparent":"`+producer+`","tracestate":"`+state+`"}`)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if out := s.Send(ctx, dispatch.Batch{Events: []dispatch.Event{ev}, Token: 3, Until: until}); out[0].Outcome != dispatch.Delivered {
		t.Fatalf("send: %v %v", out[0].Outcome, out[0].Err)
	}
	spans := exp.GetSpans()
	if len(spans) != 1 {
		t.Fatalf("%d spans, want 1", len(spans))
	}
	want := traceparentOf(spans[0].SpanContext)
	if !strings.Contains(want, producerTrace) {
		t.Fatalf("the send span %s is not in the producer's trace", want)
	}

	cons, err := kgo.NewClient(kgo.SeedBrokers(fake.ListenAddrs()...), kgo.ConsumeTopics("outbox.deal"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	var recs []*kgo.Record
	for len(recs) == 0 && ctx.Err() == nil {
		recs = append(recs, cons.PollFetches(ctx).Records()...)
	}
	if len(recs) != 1 {
		t.Fatalf("%d records, want 1", len(recs))
	}
	got := map[string][]string{}
	for _, h := range recs[0].Headers {
		got[h.Key] = append(got[h.Key], string(h.Value))
	}
	if len(got["traceparent"]) != 1 || got["traceparent"][0] != want {
		t.Errorf("record traceparent headers %q, want one, the send span's %q", got["traceparent"], want)
	}
	if len(got["tracestate"]) != 1 || got["tracestate"][0] != state {
		t.Errorf("record tracestate headers %q, want the row's %q", got["tracestate"], state)
	}
}
