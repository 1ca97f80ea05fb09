package poller

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/outboxd/outboxd/store"
)

// TracerName names the poller's tracer (the instrumentation scope).
const TracerName = "github.com/outboxd/outboxd/poller"

// Span names of one batch: the batch, then its stages as children.
const (
	SpanBatch  = "batch"
	SpanFetch  = "fetch"
	SpanClaim  = "claim"
	SpanSend   = "send"
	SpanFinish = "finish"
)

// Span attributes of the poller's own (not in the semantic conventions).
const (
	AttrFencingToken = attribute.Key("outboxd.fencing_token")
	AttrBatchSize    = attribute.Key("outboxd.batch_size")
	AttrDelivered    = attribute.Key("outboxd.delivered")
	AttrFailed       = attribute.Key("outboxd.failed")
)

// tracer is tp's tracer for the poller; nil when tp is nil: then the
// poller makes no spans at all, not even no-op ones (tracing off costs a
// nil check per stage).
func tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		return nil
	}
	return tp.Tracer(TracerName)
}

// batchTrace is one batch's span, which lives as long as its flight: from
// the fetch that found its rows until the last of them is written. The zero
// value (no span) is valid: its stages get no span.
type batchTrace struct {
	tracer trace.Tracer
	span   trace.Span
}

// startBatch starts the span of a batch whose fetch ran from start to end,
// with the fetch as its first child. It is called only for a fetch that
// found rows or failed: empty polls (every few ms when busy, every
// poll_interval when idle) would bury the batches.
func (p *Poller) startBatch(ctx context.Context, fence store.Fence, start, end time.Time, rows int, err error) batchTrace {
	if p.spans == nil {
		return batchTrace{}
	}
	ctx, span := p.spans.Start(ctx, SpanBatch, trace.WithTimestamp(start),
		trace.WithAttributes(AttrFencingToken.Int64(fence.Token), AttrBatchSize.Int(rows)))
	_, fetch := p.spans.Start(ctx, SpanFetch, trace.WithTimestamp(start), trace.WithAttributes(AttrBatchSize.Int(rows)))
	if err != nil {
		fail(fetch, err)
		fail(span, err)
	}
	fetch.End(trace.WithTimestamp(end))
	return batchTrace{tracer: p.spans, span: span}
}

// in returns ctx carrying the batch's span, for a stage to start its child
// span from (the stage's own context keeps its cancellation).
func (t batchTrace) in(ctx context.Context) context.Context {
	if t.span == nil {
		return ctx
	}
	return trace.ContextWithSpan(ctx, t.span)
}

// child starts a stage of the batch, over rows rows.
func (t batchTrace) child(ctx context.Context, name string, rows int) (context.Context, trace.Span) {
	if t.tracer == nil {
		return ctx, noop.Span{}
	}
	return t.tracer.Start(t.in(ctx), name, trace.WithAttributes(AttrBatchSize.Int(rows)))
}

// stage starts a span of a batch stage from ctx, which carries the batch's
// span (batchTrace.in); a no-op span when tracing is off.
func (p *Poller) stage(ctx context.Context, name string) (context.Context, trace.Span) {
	if p.spans == nil {
		return ctx, noop.Span{}
	}
	return p.spans.Start(ctx, name)
}

// end ends the batch's span, with err as its status if not nil.
func (t batchTrace) end(err error) {
	if t.span == nil {
		return
	}
	if err != nil {
		fail(t.span, err)
	}
	t.span.End()
}

// fail marks span failed by err.
func fail(span trace.Span, err error) {
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
}
