package blackbox

import (
	"compress/gzip"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracev1 "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/outboxd/outboxd/internal/testkit"
)

// otlpCollector is an OTLP/HTTP traces endpoint (protobuf) on a loopback
// port that keeps every span it is sent, with its resource's service.name.
type otlpCollector struct {
	srv   *httptest.Server
	mu    sync.Mutex
	spans []otlpSpan
	bad   []string // requests it could not decode
}

type otlpSpan struct {
	*tracev1.Span
	service string
}

func newOTLPCollector(t *testing.T) *otlpCollector {
	c := &otlpCollector{}
	c.srv = httptest.NewServer(http.HandlerFunc(c.serve))
	t.Cleanup(c.srv.Close)
	return c
}

func (c *otlpCollector) serve(w http.ResponseWriter, r *http.Request) {
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		gz, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = gz
	}
	raw, err := io.ReadAll(body)
	var req coltrace.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(raw, &req)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil || r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
		c.bad = append(c.bad, r.Method+" "+r.URL.Path+" "+r.Header.Get("Content-Type"))
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	for _, rs := range req.GetResourceSpans() {
		var service string
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				c.spans = append(c.spans, otlpSpan{s, service})
			}
		}
	}
	out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// find returns the first span match accepts.
func (c *otlpCollector) find(match func(otlpSpan) bool) (otlpSpan, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.spans {
		if match(s) {
			return s, true
		}
	}
	return otlpSpan{}, false
}

func (c *otlpCollector) describe() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var b strings.Builder
	for _, s := range c.spans {
		b.WriteString(s.GetName() + " trace=" + hex.EncodeToString(s.GetTraceId()) + " span=" + hex.EncodeToString(s.GetSpanId()) +
			" parent=" + hex.EncodeToString(s.GetParentSpanId()) + "\n")
	}
	if len(c.bad) > 0 {
		b.WriteString("undecodable requests: " + strings.Join(c.bad, "; "))
	}
	return b.String()
}

func attrOf(s otlpSpan, key string) string {
	for _, kv := range s.GetAttributes() {
		if kv.GetKey() == key {
			return kv.GetValue().GetStringValue()
		}
	}
	return ""
}

// The trace of one event shows producer -> relay -> sink: with
// OTEL_EXPORTER_OTLP_ENDPOINT set, the relay exports (OTLP/HTTP protobuf)
// a producer span for the event whose parent is the span in the row's
// traceparent, linked to the batch's send span (a child of the batch
// span); and the webhook receiver gets a traceparent of the producer's
// trace whose parent id is that relay span. The row's tracestate goes
// along.
func TestTraceShowsProducerRelaySink(t *testing.T) {
	t.Parallel()
	e := setup(t)
	col := newOTLPCollector(t)
	rc := newRecorder(t, nil)
	const producerTrace, producerSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	const state = "rojo=00f067aa0ba902b7"
	e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", rc.URL(),
		"OTEL_EXPORTER_OTLP_ENDPOINT", col.srv.URL,
		"OTEL_SERVICE_NAME", "outboxd-blackbox",
		"OTEL_BSP_SCHEDULE_DELAY", "50") // export every 50 ms, not every 5 s
	id := e.insert("deal", "42", `{"amount":1}`,
		`{"traceparent":"00-`+producerTrace+`-`+producerSpan+`-01","tracestate":"`+state+`"}`)
	e.start()

	rc.Wait(t, waitTimeout, "the event delivered", func(reqs []testkit.Request) bool {
		for _, r := range reqs {
			if r.ID == id && r.OK() {
				return true
			}
		}
		return false
	})
	var got testkit.Request
	for _, r := range rc.Requests() {
		if r.ID == id {
			got = r
		}
	}
	tp := strings.Split(got.Header.Get("traceparent"), "-")
	if len(tp) != 4 || tp[1] != producerTrace || tp[2] == producerSpan {
		t.Fatalf("the receiver got traceparent %q, want the producer's trace %s with the relay's span as parent", got.Header.Get("traceparent"), producerTrace)
	}
	if got.Header.Get("tracestate") != state {
		t.Errorf("the receiver got tracestate %q, want the row's %q", got.Header.Get("tracestate"), state)
	}
	relaySpan := tp[2]

	var send otlpSpan
	waitFor(t, "the relay's send span for the event exported", func() bool {
		var ok bool
		send, ok = col.find(func(s otlpSpan) bool { return hex.EncodeToString(s.GetSpanId()) == relaySpan })
		return ok
	}, col.describe)
	if hex.EncodeToString(send.GetTraceId()) != producerTrace || hex.EncodeToString(send.GetParentSpanId()) != producerSpan {
		t.Errorf("send span trace %x parent %x, want the producer's %s/%s", send.GetTraceId(), send.GetParentSpanId(), producerTrace, producerSpan)
	}
	if send.GetKind() != tracev1.Span_SPAN_KIND_PRODUCER || send.service != "outboxd-blackbox" {
		t.Errorf("send span kind %v service %q, want PRODUCER from outboxd-blackbox (OTEL_SERVICE_NAME)", send.GetKind(), send.service)
	}
	for k, v := range map[string]string{"messaging.system": "webhook", "messaging.operation.type": "send",
		"messaging.message.id": strconv.FormatInt(id, 10), "outboxd.aggregate_id": "42", "outboxd.result": "delivered"} {
		if attrOf(send, k) != v {
			t.Errorf("send span attribute %s = %q, want %q", k, attrOf(send, k), v)
		}
	}
	if len(send.GetLinks()) != 1 {
		t.Fatalf("send span has %d links, want 1 (the batch's send span)", len(send.GetLinks()))
	}
	link := send.GetLinks()[0]
	var stage, batch otlpSpan
	waitFor(t, "the batch's spans exported", func() bool {
		var ok1, ok2 bool
		stage, ok1 = col.find(func(s otlpSpan) bool { return string(s.GetSpanId()) == string(link.GetSpanId()) })
		if ok1 {
			batch, ok2 = col.find(func(s otlpSpan) bool { return string(s.GetSpanId()) == string(stage.GetParentSpanId()) })
		}
		return ok2
	}, col.describe)
	if stage.GetName() != "send" || batch.GetName() != "batch" || len(batch.GetParentSpanId()) != 0 {
		t.Errorf("the link leads to %q, child of %q (parent %x); want the batch's send stage under a root batch span", stage.GetName(), batch.GetName(), batch.GetParentSpanId())
	}
}

// Tracing settings the exporter cannot use stop `run` with exit 2 naming
// the variable, like any other bad setting.
func TestBadTracingSettingExit2(t *testing.T) {
	t.Parallel()
	v := with(cliVars(t), "OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon")
	res := runBinary(t, v, exitLimit, "run")
	if res.timedOut || res.code != 2 || !strings.Contains(res.stderr, "OTEL_EXPORTER_OTLP_PROTOCOL") {
		t.Errorf("want exit 2 with stderr naming OTEL_EXPORTER_OTLP_PROTOCOL; got %s", res)
	}
}
