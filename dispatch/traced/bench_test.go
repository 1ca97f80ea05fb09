package traced_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/dispatch/traced"
)

// The per-event cost of tracing on a 500-event batch to the no-op sink:
// off (the sink as the app leaves it when tracing is off: not wrapped) and
// on (the SDK, batch processor, spans discarded: export cost not
// included). Half the rows carry a traceparent.
//
//	go test -run '^$' -bench . -benchmem ./dispatch/traced/
func BenchmarkSend(b *testing.B) {
	events := make([]dispatch.Event, 500)
	for i := range events {
		h := `{}`
		if i%2 == 0 {
			h = `{"traceparent":"` + producer + `"}`
		}
		events[i] = dispatch.Event{ID: int64(i), AggregateType: "deal", AggregateID: strconv.Itoa(i % 50), EventType: "deal.funded",
			Payload: json.RawMessage(`{"amount":1}`), Headers: json.RawMessage(h), CreatedAt: time.Now()}
	}
	batch := dispatch.Batch{Events: events, Until: until}
	sdk := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	defer func() { _ = sdk.Shutdown(context.Background()) }()
	ctx, span := sdk.Tracer("bench").Start(context.Background(), "send")
	defer span.End()
	for _, bc := range []struct {
		name string
		sink dispatch.Sink
	}{
		{"off", dispatch.Noop{}},
		{"on", traced.Wrap(dispatch.Noop{}, sdk, traced.Options{System: "noop"})},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				bc.sink.Send(ctx, batch)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(events)), "ns/event")
		})
	}
}
