package traced_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.39.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/dispatch/traced"
)

const (
	producerTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	producerSpan  = "00f067aa0ba902b7"
	producer      = "00-" + producerTrace + "-" + producerSpan + "-01"
	state         = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
)

// recorder is a per-event sink (dispatch.PerEvent) that keeps the headers
// of every event it was given and fails the aggregates named in fail.
type recorder struct {
	mu      sync.Mutex
	headers map[int64]map[string]any
	raw     map[int64]string
	fail    map[string]error
}

func (r *recorder) send(_ context.Context, ev dispatch.Event, _ int64) error {
	var h map[string]any
	_ = json.Unmarshal(ev.Headers, &h)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.headers == nil {
		r.headers, r.raw = map[int64]map[string]any{}, map[int64]string{}
	}
	r.headers[ev.ID], r.raw[ev.ID] = h, string(ev.Headers)
	return r.fail[ev.AggregateID]
}

func (r *recorder) header(id int64, name string) any {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.headers[id][name]
}

func event(id int64, agg, headers string) dispatch.Event {
	return dispatch.Event{ID: id, AggregateType: "deal", AggregateID: agg, EventType: "deal.funded",
		Payload: json.RawMessage(`{"amount":1}`), Headers: json.RawMessage(headers), CreatedAt: time.Now()}
}

// testBundle is a traced sink over rec, the exporter its spans end in and
// a tracer of the same provider.
type testBundle struct {
	sink   dispatch.Sink
	spans  *tracetest.InMemoryExporter
	tracer trace.Tracer
}

// setup wraps rec's sends in traced, exporting synchronously in memory.
func setup(t *testing.T, rec *recorder) testBundle {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	s := traced.Wrap(dispatch.PerEvent(rec.send, 4, dispatch.Capabilities{}), tp, traced.Options{
		System: "kafka", Template: "outbox.{aggregate_type}",
		Destination: func(ev dispatch.Event) string { return "outbox." + ev.AggregateType },
		Attributes: func(ev dispatch.Event) []attribute.KeyValue {
			return []attribute.KeyValue{semconv.MessagingKafkaMessageKey(ev.AggregateID)}
		},
	})
	return testBundle{sink: s, spans: exp, tracer: tp.Tracer("test")}
}

func traceparentOf(sc trace.SpanContext) string {
	return fmt.Sprintf("00-%s-%s-%s", sc.TraceID(), sc.SpanID(), sc.TraceFlags())
}

func attrs(s tracetest.SpanStub) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes {
		m[kv.Key] = kv.Value
	}
	return m
}

func until() time.Time { return time.Now().Add(time.Minute) }

// One producer span per event: parented to the row's traceparent (with the
// row's tracestate, and a link to the caller's span) when it has one,
// otherwise to the caller's span; the sink sees the span's own context in
// the event's headers, other headers untouched; messaging attributes set.
func TestSendSpansFollowTheRowsTraceAndAreInjected(t *testing.T) {
	rec := &recorder{}
	b := setup(t, rec)
	s, exp, tr := b.sink, b.spans, b.tracer
	ctx, call := tr.Start(context.Background(), "send")
	evs := []dispatch.Event{
		event(1, "a", `{"traceparent":"`+producer+`","tracestate":"`+state+`","x":"<kept>"}`),
		event(2, "b", `{}`),
		event(3, "c", `{"traceparent":"garbage","TraceState":"bogus=1"}`), // replaced, not forwarded
		event(4, "d", `{"n": 3, "s": "x"}`),                               // no trace context: prepended
		event(5, "e", `{"trac\u0065parent": "garbage"}`),                  // an escaped name is still the header
		event(6, "f", ``), // no headers at all
	}
	out := s.Send(ctx, dispatch.Batch{Events: evs, Token: 7, Until: until})
	call.End()
	for i, r := range out {
		if r.Outcome != dispatch.Delivered {
			t.Fatalf("event %d: %v, want delivered", i, r.Outcome)
		}
	}
	if evs[0].Headers == nil || string(evs[0].Headers) != `{"traceparent":"`+producer+`","tracestate":"`+state+`","x":"<kept>"}` {
		t.Fatalf("the caller's event was changed: %s", evs[0].Headers)
	}
	byID := map[string]tracetest.SpanStub{}
	for _, sp := range exp.GetSpans() {
		if sp.SpanKind == trace.SpanKindProducer {
			byID[attrs(sp)[semconv.MessagingMessageIDKey].AsString()] = sp
		}
	}
	if len(byID) != len(evs) {
		t.Fatalf("%d producer spans, want %d: %v", len(byID), len(evs), exp.GetSpans())
	}
	callSC := call.SpanContext()

	one := byID["1"]
	if got := one.Parent; got.TraceID().String() != producerTrace || got.SpanID().String() != producerSpan || !got.IsRemote() {
		t.Errorf("event 1's span parent = %v, want the row's traceparent", got)
	}
	if len(one.Links) != 1 || one.Links[0].SpanContext.SpanID() != callSC.SpanID() {
		t.Errorf("event 1's span links %v, want one to the caller's span %s", one.Links, callSC.SpanID())
	}
	if got := rec.header(1, "traceparent"); got != traceparentOf(one.SpanContext) {
		t.Errorf("event 1 sent with traceparent %v, want its send span's %s", got, traceparentOf(one.SpanContext))
	}
	if got := rec.header(1, "tracestate"); got != state {
		t.Errorf("event 1 sent with tracestate %v, want the row's %q", got, state)
	}
	if got := rec.header(1, "x"); got != "<kept>" {
		t.Errorf("event 1's other header became %v", got)
	}

	for _, id := range []int64{2, 3, 4, 5, 6} {
		sp := byID[strconv.FormatInt(id, 10)]
		if sp.Parent.SpanID() != callSC.SpanID() || sp.SpanContext.TraceID() != callSC.TraceID() || len(sp.Links) != 0 {
			t.Errorf("event %d's span parent %v links %v, want the caller's span %v and no link", id, sp.Parent, sp.Links, callSC)
		}
		if got := rec.header(id, "traceparent"); got != traceparentOf(sp.SpanContext) {
			t.Errorf("event %d sent with traceparent %v, want its send span's %s", id, got, traceparentOf(sp.SpanContext))
		}
		if rec.header(id, "tracestate") != nil || rec.header(id, "TraceState") != nil {
			t.Errorf("event %d sent with a tracestate its span does not have", id)
		}
	}
	rec.mu.Lock()
	if h := rec.headers[4]; len(h) != 3 || h["n"] != float64(3) || h["s"] != "x" {
		t.Errorf("event 4's other headers: %s, want n and s kept beside traceparent", rec.raw[4])
	}
	if h := rec.headers[5]; len(h) != 1 || strings.Count(rec.raw[5], "parent") != 1 {
		t.Errorf("event 5's escaped traceparent not replaced: %s", rec.raw[5])
	}
	rec.mu.Unlock()

	a := attrs(one)
	want := map[attribute.Key]string{
		semconv.MessagingSystemKey:              "kafka",
		semconv.MessagingOperationTypeKey:       "send",
		semconv.MessagingDestinationNameKey:     "outbox.deal",
		semconv.MessagingDestinationTemplateKey: "outbox.{aggregate_type}",
		semconv.MessagingKafkaMessageKeyKey:     "a",
		traced.AttrAggregateType:                "deal",
		traced.AttrResult:                       "delivered",
	}
	for k, v := range want {
		if a[k].AsString() != v {
			t.Errorf("attribute %s = %q, want %q", k, a[k].AsString(), v)
		}
	}
	if one.Name != "send outbox.{aggregate_type}" {
		t.Errorf("span name %q", one.Name)
	}
}

// A row's trace headers count whatever the case of their names, as HTTP
// header names do: a "Traceparent" and "TraceState" parent the span as the
// lower-case names would, and the sink sees the span's own context under
// the lower-case names only.
func TestRowsTraceHeadersAreFoundInAnyCase(t *testing.T) {
	rec := &recorder{}
	b := setup(t, rec)
	s, exp, tr := b.sink, b.spans, b.tracer
	ctx, call := tr.Start(context.Background(), "send")
	out := s.Send(ctx, dispatch.Batch{Events: []dispatch.Event{event(1, "a", `{"Traceparent":"`+producer+`","TraceState":"`+state+`"}`)},
		Token: 7, Until: until})
	call.End()
	if out[0].Outcome != dispatch.Delivered {
		t.Fatalf("%v, want delivered", out[0].Outcome)
	}
	var sp tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.SpanKind == trace.SpanKindProducer {
			sp = s
		}
	}
	if got := sp.Parent; got.TraceID().String() != producerTrace || got.SpanID().String() != producerSpan || !got.IsRemote() {
		t.Errorf("the span's parent = %v, want the row's Traceparent %s", got, producer)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	h := rec.headers[1]
	if len(h) != 2 || h["traceparent"] != traceparentOf(sp.SpanContext) || h["tracestate"] != state {
		t.Errorf("sent headers %s, want only traceparent %s and the row's tracestate", rec.raw[1], traceparentOf(sp.SpanContext))
	}
}

// A failed event's span says so (status, error.type, the error); the
// events after it in its aggregate end as not attempted; every span ends
// once, and the caller's Done still hears every result.
func TestSendSpansCarryTheResult(t *testing.T) {
	rec := &recorder{fail: map[string]error{"bad": &dispatch.Error{Err: errors.New("receiver answered 503"), RetryAfter: time.Second}}}
	b := setup(t, rec)
	s, exp := b.sink, b.spans
	var mu sync.Mutex
	done := map[int]dispatch.Outcome{}
	out := s.Send(context.Background(), dispatch.Batch{
		Events: []dispatch.Event{event(1, "bad", `{}`), event(2, "bad", `{}`), event(3, "ok", `[1]`)},
		Until:  until,
		Done: func(i int, r dispatch.Result) {
			mu.Lock()
			defer mu.Unlock()
			done[i] = r.Outcome
		},
	})
	wantOut := []dispatch.Outcome{dispatch.Retryable, dispatch.NotAttempted, dispatch.Delivered}
	for i, w := range wantOut {
		if out[i].Outcome != w || done[i] != w {
			t.Errorf("event %d: returned %v, Done %v, want %v", i+1, out[i].Outcome, done[i], w)
		}
	}
	rec.mu.Lock()
	if raw := rec.raw[3]; raw != `[1]` {
		t.Errorf("headers that are not an object were changed to %s", raw)
	}
	rec.mu.Unlock()
	spans := exp.GetSpans()
	if len(spans) != 3 {
		t.Fatalf("%d spans, want 3 (each ended once)", len(spans))
	}
	for _, sp := range spans {
		a := attrs(sp)
		switch a[semconv.MessagingMessageIDKey].AsString() {
		case "1":
			if sp.Status.Code != codes.Error || a[semconv.ErrorTypeKey].AsString() != "retryable" || len(sp.Events) == 0 {
				t.Errorf("failed event's span: status %v, error.type %v, events %v", sp.Status, a[semconv.ErrorTypeKey], sp.Events)
			}
		case "2":
			if sp.Status.Code == codes.Error || a[traced.AttrResult].AsString() != "not attempted" {
				t.Errorf("not attempted event's span: status %v, result %v", sp.Status, a[traced.AttrResult])
			}
		case "3":
			if sp.Status.Code == codes.Error || a[traced.AttrResult].AsString() != "delivered" {
				t.Errorf("delivered event's span: status %v, result %v", sp.Status, a[traced.AttrResult])
			}
		}
	}
}
