// Package tracing builds outboxd's OpenTelemetry tracer provider from the
// standard OTEL_* environment variables.
//
// Tracing is opt-in: with none of OTEL_TRACES_EXPORTER,
// OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT set, or
// with OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none, the provider is
// OpenTelemetry's no-op one: spans cost a few nanoseconds and nothing is
// exported. Otherwise the exporter is the one autoexport builds from the
// environment (OTLP over HTTP/protobuf by default, gRPC with
// OTEL_EXPORTER_OTLP_PROTOCOL=grpc), behind the SDK's batch span processor
// (OTEL_BSP_*), sampled as OTEL_TRACES_SAMPLER says (default: parent-based,
// always on). The resource is service.name=outboxd unless OTEL_SERVICE_NAME
// or OTEL_RESOURCE_ATTRIBUTES say otherwise.
//
// It does not guarantee that every span is exported: a collector that is
// down or slow loses spans (the batch processor drops them when its queue is
// full), never events.
package tracing

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"slices"
	"strings"

	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.39.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// ServiceName is the service.name of outboxd's spans unless the environment
// names another.
const ServiceName = "outboxd"

// EnvError: an OTEL_* environment variable has a value tracing cannot use.
type EnvError struct {
	Var string // e.g. "OTEL_EXPORTER_OTLP_PROTOCOL"
	Err error
}

func (e *EnvError) Error() string { return fmt.Sprintf("tracing: %s: %v", e.Var, e.Err) }
func (e *EnvError) Unwrap() error { return e.Err }

// check refuses the values autoexport would refuse, naming the variable.
func check(getenv func(string) string) error {
	for _, c := range []struct {
		name string
		ok   []string
	}{
		{"OTEL_TRACES_EXPORTER", []string{"", "otlp", "console", "none"}},
		{"OTEL_EXPORTER_OTLP_PROTOCOL", []string{"", "grpc", "http/protobuf"}},
		{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", []string{"", "grpc", "http/protobuf"}},
	} {
		if v := getenv(c.name); !slices.Contains(c.ok, v) {
			return &EnvError{Var: c.name, Err: fmt.Errorf("%q is not one of %q", v, c.ok[1:])}
		}
	}
	return nil
}

// Provider is the tracer provider and what it takes to stop it.
type Provider struct {
	trace.TracerProvider
	// Enabled is false for the no-op provider: callers skip work that only
	// spans need (rewriting headers for the trace context).
	Enabled  bool
	Service  string // service.name of the spans; "" when off
	shutdown func(context.Context) error
}

// Shutdown flushes the spans not yet exported (bounded by ctx) and stops
// the exporter. A no-op for the no-op provider.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p.shutdown == nil {
		return nil
	}
	return p.shutdown(ctx)
}

// Requested reports whether the environment asks for traces (see the
// package doc).
func Requested(getenv func(string) string) bool {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return false
	}
	switch exp := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); exp {
	case "none":
		return false
	case "":
		return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
	default:
		return true
	}
}

// FromEnv returns the provider the environment asks for. Export failures
// are logged on log at WARN ("trace export failed"), so output stays JSON.
// A value it cannot use is an *EnvError naming the variable.
func FromEnv(ctx context.Context, log *slog.Logger) (*Provider, error) {
	if !Requested(os.Getenv) {
		return &Provider{TracerProvider: noop.NewTracerProvider()}, nil
	}
	if err := check(os.Getenv); err != nil {
		return nil, err
	}
	exp, err := autoexport.NewSpanExporter(ctx)
	if err != nil {
		return nil, &EnvError{Var: "OTEL_TRACES_EXPORTER", Err: err}
	}
	if autoexport.IsNoneSpanExporter(exp) {
		return &Provider{TracerProvider: noop.NewTracerProvider()}, nil
	}
	// The SDK reports export failures through the global handler, by
	// default as plain text on stderr.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("trace export failed", "error", err)
	}))
	attrs := resource.WithAttributes(semconv.ServiceName(ServiceName))
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		attrs = resource.WithAttributes(semconv.ServiceName(ServiceName), semconv.ServiceVersion(bi.Main.Version))
	}
	// Later detectors win: OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME
	// override the defaults.
	res, err := resource.New(ctx, attrs, resource.WithTelemetrySDK(), resource.WithHost(), resource.WithFromEnv())
	if err != nil {
		if res == nil {
			_ = exp.Shutdown(ctx)
			return nil, &EnvError{Var: "OTEL_RESOURCE_ATTRIBUTES", Err: err}
		}
		// A partial resource (an unparsable OTEL_RESOURCE_ATTRIBUTES entry)
		// is still worth exporting under.
		log.Warn("trace resource incomplete", "error", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	service, _ := res.Set().Value(semconv.ServiceNameKey)
	return &Provider{TracerProvider: tp, Enabled: true, Service: service.AsString(), shutdown: tp.Shutdown}, nil
}
