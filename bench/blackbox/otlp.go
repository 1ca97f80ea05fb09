package main

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpSink is the local OTLP/HTTP traces endpoint a -tracing on run exports
// to: it decodes each export (protobuf, gzip or not), counts its spans and
// answers success, as a collector that keeps up would. It runs in the
// bench's process, so its CPU is not the relay's.
type otlpSink struct {
	srv             *http.Server
	url             string
	spans, requests atomic.Int64
	bad             atomic.Int64 // exports that did not decode
	done            chan struct{}
}

func startOTLPSink() *otlpSink {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	s := &otlpSink{url: "http://" + ln.Addr().String(), done: make(chan struct{})}
	s.srv = &http.Server{Handler: http.HandlerFunc(s.serve), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintln(os.Stderr, "blackbox: otlp sink:", err)
		}
	}()
	atExit(s.stop)
	return s
}

func (s *otlpSink) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = s.srv.Shutdown(ctx)
	<-s.done
}

func (s *otlpSink) serve(w http.ResponseWriter, r *http.Request) {
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		gz, err := gzip.NewReader(r.Body)
		if err != nil {
			s.bad.Add(1)
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
	if err != nil || r.URL.Path != "/v1/traces" {
		s.bad.Add(1)
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	n := 0
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			n += len(ss.GetSpans())
		}
	}
	s.spans.Add(int64(n))
	s.requests.Add(1)
	out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// tracingEnv is the relay's environment for a -tracing mode: "on" exports
// every span (the default sampler) over OTLP/HTTP to sink; "off" leaves
// every OTEL_* variable out, so tracing is off whatever the bench's own
// environment says.
func tracingEnv(mode string, sink *otlpSink) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OTEL_") {
			env = append(env, kv)
		}
	}
	if mode == "on" {
		env = append(env, "OTEL_EXPORTER_OTLP_ENDPOINT="+sink.url, "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
			"OTEL_TRACES_EXPORTER=otlp", "OTEL_SERVICE_NAME=outboxd-bench")
	}
	return env
}

// tracingModes reads -tracing: "" (the environment as it is), or a comma
// list of off and on, each run once per mode in turn.
func tracingModes(list string) []string {
	if strings.TrimSpace(list) == "" {
		return []string{""}
	}
	var out []string
	for _, m := range strings.Split(list, ",") {
		switch m = strings.TrimSpace(m); m {
		case "off", "on":
			out = append(out, m)
		default:
			check(fmt.Errorf("-tracing: want off, on or off,on; got %q", m))
		}
	}
	return out
}
