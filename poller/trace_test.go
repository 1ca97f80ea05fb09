package poller

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.39.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxd/outboxd/dispatch/traced"
	"github.com/outboxd/outboxd/dispatch/webhook"
	"github.com/outboxd/outboxd/internal/testkit"
	"github.com/outboxd/outboxd/store"
)

// One batch is one trace: a root "batch" span with fetch, claim, send and
// finish as its children; each event's producer span is a child of the
// batch's send span, or, for a row carrying a traceparent, of the
// producer's span (linked to the batch's send span); and the webhook
// receives each event's own send span context as traceparent.
func TestBatchSpanTree(t *testing.T) {
	e := setup(t)
	const producerTrace, producerSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	ctx := context.Background()
	if err := pgx.BeginFunc(ctx, e.st.Pool(), func(tx pgx.Tx) error {
		return store.Enqueue(ctx, tx,
			store.Event{AggregateType: "deal", AggregateID: "1", EventType: "deal.funded", Payload: json.RawMessage(`{}`),
				Headers: map[string]string{"traceparent": "00-" + producerTrace + "-" + producerSpan + "-01"}},
			store.Event{AggregateType: "deal", AggregateID: "2", EventType: "deal.funded", Payload: json.RawMessage(`{}`)})
	}); err != nil {
		t.Fatal(err)
	}
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer func() { _ = tp.Shutdown(ctx) }()
	cfg := testConfig()
	sink, err := webhook.New(webhook.Config{URL: e.rc.URL(), Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	r := e.pollerWith(cfg, traced.Wrap(sink, tp, traced.Options{System: "webhook"}))
	r.spans = tracer(tp)
	stop := e.run(r)
	e.rc.WaitDelivered(t, 10*time.Second, 2)
	e.waitFor("both rows marked", 10*time.Second, func() bool { return e.count("dispatched_at IS NOT NULL") == 2 })
	stop() // every flight ended: its batch span too

	spans := exp.GetSpans()
	var batches []tracetest.SpanStub
	for _, s := range spans {
		if s.Name == SpanBatch {
			batches = append(batches, s)
		}
	}
	if len(batches) != 1 {
		t.Fatalf("%d batch spans, want 1 (empty polls make none): %v", len(batches), names(spans))
	}
	batch := batches[0]
	if batch.Parent.IsValid() {
		t.Errorf("the batch span has a parent %v", batch.Parent)
	}
	children := map[string][]tracetest.SpanStub{}
	for _, s := range spans {
		if s.Parent.SpanID() == batch.SpanContext.SpanID() {
			children[s.Name] = append(children[s.Name], s)
		}
	}
	for _, name := range []string{SpanFetch, SpanClaim, SpanSend} {
		if len(children[name]) != 1 {
			t.Errorf("%d %q children of the batch, want 1: %v", len(children[name]), name, names(spans))
		}
	}
	if len(children[SpanFinish]) == 0 {
		t.Errorf("no finish child of the batch: %v", names(spans))
	}
	if t.Failed() {
		t.FailNow()
	}
	send := children[SpanSend][0].SpanContext
	producers := 0
	for _, s := range spans {
		if s.SpanKind != trace.SpanKindProducer {
			continue
		}
		producers++
		id := attr(s, string(semconv.MessagingMessageIDKey))
		req := requestFor(e, id)
		if got, want := req.Header.Get("traceparent"), fmt.Sprintf("00-%s-%s-01", s.SpanContext.TraceID(), s.SpanContext.SpanID()); got != want {
			t.Errorf("event %s: the receiver got traceparent %q, want its send span's %q", id, got, want)
		}
		switch attr(s, string(traced.AttrAggregateID)) {
		case "1": // the producer's trace
			if s.Parent.TraceID().String() != producerTrace || s.Parent.SpanID().String() != producerSpan {
				t.Errorf("event %s: send span parent %v, want the row's traceparent", id, s.Parent)
			}
			if len(s.Links) != 1 || s.Links[0].SpanContext.SpanID() != send.SpanID() {
				t.Errorf("event %s: send span links %v, want the batch's send span", id, s.Links)
			}
		case "2":
			if s.Parent.SpanID() != send.SpanID() {
				t.Errorf("event %s: send span parent %v, want the batch's send span %v", id, s.Parent, send)
			}
		default:
			t.Errorf("a producer span for no known event: %v", s.Attributes)
		}
	}
	if producers != 2 {
		t.Errorf("%d producer (per-event send) spans, want 2: %v", producers, names(spans))
	}
}

func names(spans tracetest.SpanStubs) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name)
	}
	return out
}

func attr(s tracetest.SpanStub, key string) string {
	for _, kv := range s.Attributes {
		if string(kv.Key) == key {
			return kv.Value.String()
		}
	}
	return ""
}

// requestFor is the receiver's request for event id (decimal).
func requestFor(e *testBundle, id string) testkit.Request {
	for _, r := range e.rc.Requests() {
		if fmt.Sprint(r.ID) == id {
			return r
		}
	}
	e.t.Fatalf("the receiver got no request for event %s", id)
	return testkit.Request{}
}

// The poller's spans with tracing off (the no-op provider), per batch:
// the batch and fetch spans, claim, send and finish, as batch, launch and
// finish make them.
//
//	go test -run '^$' -bench BatchSpansOff -benchmem ./poller/
func BenchmarkBatchSpansOff(b *testing.B) {
	p := &Poller{spans: tracer(nil)}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		now := time.Now()
		tr := p.startBatch(ctx, store.Fence{Token: 1}, now, now, 500, nil)
		_, claim := tr.child(ctx, SpanClaim, 500)
		claim.End()
		sctx, send := tr.child(ctx, SpanSend, 500)
		send.End()
		_, finish := p.stage(tr.in(sctx), SpanFinish)
		finish.End()
		tr.end(nil)
	}
}
