// Package traced wraps a dispatch.Sink so that every event it sends gets a
// producer span following the OpenTelemetry messaging semantic conventions,
// and carries that span's W3C trace context to the destination.
//
// Guarantees:
//   - One span per event handed to the sink, named "send <destination>"
//     (kind producer), with messaging.system, messaging.operation.type
//     "send", messaging.destination.name (and .template for a templated
//     destination), messaging.message.id (the outbox id), the aggregate
//     (outboxd.aggregate_type, outboxd.aggregate_id; the caller adds the
//     system's own message key, e.g. messaging.kafka.message.key), and the
//     event's result. It ends when the sink reports
//     the event's result (Batch.Done or Send's return), so for a sink that
//     sends one event at a time it also covers the wait behind earlier
//     events of its aggregate.
//   - Parent: the span context of the row's own "traceparent" (and
//     "tracestate") header when it is valid W3C Trace Context, with a link
//     to the span of the call (the poller's batch send span); otherwise
//     the span of the call itself. So the producer's trace shows the relay.
//   - The event's "traceparent" and "tracestate" headers are replaced by
//     the send span's context (an invalid one from the row is replaced too)
//     before the inner sink sees the event: every sink puts the row's
//     headers on its messages (HTTP request headers for traceparent and
//     tracestate on the webhook, record headers, NATS and AMQP headers,
//     stream fields), so each binding carries the relay's trace context
//     without knowing of tracing. A row whose headers are not a JSON object
//     is sent as it is.
//
// It does not guarantee that spans are exported (see internal/tracing), and
// changes nothing else of the event or its result. Wrap a sink only when
// tracing is on: off, the wrapper is not there and costs nothing.
package traced

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.39.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxd/outboxd/dispatch"
)

// TracerName names the wrapper's tracer (the instrumentation scope).
const TracerName = "github.com/outboxd/outboxd/dispatch/traced"

// Span attributes of outboxd's own (not in the semantic conventions).
const (
	AttrAggregateType = attribute.Key("outboxd.aggregate_type")
	AttrAggregateID   = attribute.Key("outboxd.aggregate_id")
	AttrEventType     = attribute.Key("outboxd.event_type")
	AttrResult        = attribute.Key("outboxd.result") // dispatch.Outcome's text
	AttrRef           = attribute.Key("outboxd.ref")    // the destination's reference (partition/offset, sequence)
)

// Options describe the destination for the spans' attributes.
type Options struct {
	// System is messaging.system: "kafka", "rabbitmq", "nats", "redis",
	// "webhook".
	System string
	// Template is the destination template when the destination is
	// rendered per event (messaging.destination.template; the span name
	// uses it, which keeps span names few); "" when fixed.
	Template string
	// Destination names the destination of ev (messaging.destination.name);
	// nil: none.
	Destination func(ev dispatch.Event) string
	// Attributes are the system's own attributes of ev (a message key, a
	// routing key); nil: none.
	Attributes func(ev dispatch.Event) []attribute.KeyValue
}

// Wrap returns s with spans; tp gives the tracer.
func Wrap(s dispatch.Sink, tp trace.TracerProvider, o Options) dispatch.Sink {
	w := &sink{inner: s, tracer: tp.Tracer(TracerName), o: o, fixed: []attribute.KeyValue{
		semconv.MessagingSystemKey.String(o.System),
		semconv.MessagingOperationTypeSend,
		semconv.MessagingOperationName("send"),
	}}
	if o.Template != "" {
		w.fixed = append(w.fixed, semconv.MessagingDestinationTemplate(o.Template))
		w.name = "send " + o.Template
	}
	return w
}

type sink struct {
	inner  dispatch.Sink
	tracer trace.Tracer
	o      Options
	fixed  []attribute.KeyValue // the attributes every span has
	name   string               // the span name, when it does not depend on the event
}

// W3C Trace Context only: baggage in a row's headers passes as it is.
var propagator = propagation.TraceContext{}

// Header names the propagator reads and writes.
const (
	traceparent = "traceparent"
	tracestate  = "tracestate"
)

func (s *sink) Capabilities() dispatch.Capabilities { return s.inner.Capabilities() }

// Close closes the inner sink, if it has anything to close.
func (s *sink) Close() error {
	if c, ok := s.inner.(interface{ Close() error }); ok {
		return c.Close()
	}
	return nil
}

// Unwrap returns the inner sink.
func (s *sink) Unwrap() dispatch.Sink { return s.inner }

// Send implements dispatch.Sink: spans started, headers rewritten, the
// batch sent by the inner sink, each span ended with its event's result.
func (s *sink) Send(ctx context.Context, b dispatch.Batch) []dispatch.Result {
	call := trace.SpanFromContext(ctx).SpanContext()
	spans := make([]trace.Span, len(b.Events))
	ended := make([]atomic.Bool, len(b.Events))
	events := make([]dispatch.Event, len(b.Events))
	for i, ev := range b.Events {
		var span trace.Span
		events[i], span = s.start(ctx, call, ev)
		spans[i] = span
	}
	end := func(i int, r dispatch.Result) {
		if i >= 0 && i < len(spans) && ended[i].CompareAndSwap(false, true) {
			finish(spans[i], r)
		}
	}
	inner := b
	inner.Events = events
	inner.Done = func(i int, r dispatch.Result) {
		end(i, r)
		if b.Done != nil {
			b.Done(i, r)
		}
	}
	out := s.inner.Send(ctx, inner)
	for i := range spans {
		if i < len(out) {
			end(i, out[i])
		} else {
			end(i, dispatch.Result{Outcome: dispatch.NotAttempted}) // a sink that breaks its contract
		}
	}
	return out
}

// start starts ev's span and returns ev with its trace headers replaced.
func (s *sink) start(ctx context.Context, call trace.SpanContext, ev dispatch.Event) (dispatch.Event, trace.Span) {
	attrs := make([]attribute.KeyValue, 0, 8+len(s.fixed))
	attrs = append(attrs, s.fixed...)
	attrs = append(attrs,
		semconv.MessagingMessageID(strconv.FormatInt(ev.ID, 10)),
		semconv.MessagingMessageBodySize(len(ev.Payload)),
		AttrAggregateType.String(ev.AggregateType),
		AttrAggregateID.String(ev.AggregateID),
		AttrEventType.String(ev.EventType),
	)
	name := s.name
	if s.o.Destination != nil {
		dest := s.o.Destination(ev)
		attrs = append(attrs, semconv.MessagingDestinationName(dest))
		if name == "" {
			name = "send " + dest
		}
	}
	if name == "" {
		name = "send"
	}
	if s.o.Attributes != nil {
		attrs = append(attrs, s.o.Attributes(ev)...)
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...)}
	obj, plain := shape(ev.Headers)
	var headers map[string]json.RawMessage
	parent := ctx
	if obj && !plain {
		headers, obj = decodeHeaders(ev.Headers)
	}
	if headers != nil {
		// The row's trace, when it carries a valid one; linked to the call.
		if rc := trace.SpanContextFromContext(propagator.Extract(context.Background(), carrier(headers))); rc.IsValid() {
			parent = trace.ContextWithRemoteSpanContext(ctx, rc)
			if call.IsValid() {
				opts = append(opts, trace.WithLinks(trace.Link{SpanContext: call}))
			}
		}
	}
	sctx, span := s.tracer.Start(parent, name, opts...)
	switch {
	case !obj:
	case headers != nil:
		ev.Headers = inject(sctx, headers, ev.Headers)
	default:
		ev.Headers = prepend(sctx, ev.Headers)
	}
	return ev, span
}

// shape tells whether raw (a row's headers) is a JSON object, and whether
// it is plainly free of trace context: no name or value holds "trace" in
// any case, and nothing is escaped (an escaped name could spell one). Most
// rows are plain; they skip decoding.
func shape(raw json.RawMessage) (obj, plain bool) {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 {
		return true, true // no headers: {}
	}
	if t[0] != '{' {
		return false, false
	}
	return true, bytes.IndexByte(t, '\\') < 0 && !containsFold(t, "trace")
}

// containsFold reports whether s holds sub (lower-case ASCII) in any case.
func containsFold(s []byte, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		j := 0
		for j < len(sub) && s[i+j]|0x20 == sub[j] {
			j++
		}
		if j == len(sub) {
			return true
		}
	}
	return false
}

// fields is a carrier of the two trace headers, for prepend.
type fields struct{ parent, state string }

func (f *fields) Get(string) string { return "" }
func (f *fields) Keys() []string    { return nil }
func (f *fields) Set(key, value string) {
	switch key {
	case traceparent:
		f.parent = value
	case tracestate:
		f.state = value
	}
}

// prepend puts sctx's trace headers first in raw, a JSON object holding
// none (shape said plain), without decoding it.
func prepend(sctx context.Context, raw json.RawMessage) json.RawMessage {
	var f fields
	propagator.Inject(sctx, &f)
	if f.parent == "" {
		return raw
	}
	t := bytes.TrimSpace(raw)
	var rest []byte // what followed '{', if anything is in the object
	if len(t) > 0 {
		rest = bytes.TrimSpace(t[1:])
		if len(rest) > 0 && rest[0] == '}' {
			rest = nil
		}
	}
	out := make([]byte, 0, len(t)+len(f.parent)+len(f.state)+40)
	out = append(out, `{"traceparent":`...)
	out = strconv.AppendQuote(out, f.parent)
	if f.state != "" {
		out = append(out, `,"tracestate":`...)
		b, _ := json.Marshal(f.state) // a string always encodes
		out = append(out, b...)
	}
	if rest == nil {
		return append(out, '}')
	}
	out = append(out, ',')
	return append(out, rest...)
}

// finish records r on span and ends it.
func finish(span trace.Span, r dispatch.Result) {
	span.SetAttributes(AttrResult.String(r.Outcome.String()))
	if r.Ref != "" {
		span.SetAttributes(AttrRef.String(r.Ref))
	}
	switch r.Outcome {
	case dispatch.Retryable, dispatch.Permanent:
		span.SetAttributes(semconv.ErrorTypeKey.String(r.Outcome.String()))
		if r.Err != nil {
			span.RecordError(r.Err)
			span.SetStatus(codes.Error, dispatch.Clip(r.Err.Error(), 512))
		} else {
			span.SetStatus(codes.Error, r.Outcome.String())
		}
	}
	span.End()
}

// decodeHeaders reads a row's headers object; ok is false when they are
// not one (empty headers count as {}).
func decodeHeaders(raw json.RawMessage) (map[string]json.RawMessage, bool) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return map[string]json.RawMessage{}, true
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil || m == nil {
		return nil, false
	}
	return m, true
}

// carrier gives the propagator the row's trace headers (string values;
// names compared case-insensitively, as HTTP does).
type carrier map[string]json.RawMessage

func (c carrier) Get(key string) string {
	for k, v := range c {
		if strings.EqualFold(k, key) {
			var s string
			if json.Unmarshal(v, &s) == nil {
				return s
			}
		}
	}
	return ""
}

func (c carrier) Set(key, value string) {
	b, _ := json.Marshal(value) // a string always encodes
	c[key] = b
}

func (c carrier) Keys() []string {
	ks := make([]string, 0, len(c))
	for k := range c {
		ks = append(ks, k)
	}
	return ks
}

// inject replaces the trace headers in headers by sctx's span context and
// returns the new headers object; orig when it cannot be encoded.
func inject(sctx context.Context, headers map[string]json.RawMessage, orig json.RawMessage) json.RawMessage {
	for k := range headers {
		if strings.EqualFold(k, traceparent) || strings.EqualFold(k, tracestate) {
			delete(headers, k)
		}
	}
	propagator.Inject(sctx, carrier(headers))
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // values stay as the producer wrote them
	if enc.Encode(headers) != nil {
		return orig
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}
