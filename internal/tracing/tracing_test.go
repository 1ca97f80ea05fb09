package tracing

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
)

// Off unless the environment asks; OTEL_SDK_DISABLED and
// OTEL_TRACES_EXPORTER=none win over an endpoint.
func TestRequested(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want bool
	}{
		{map[string]string{}, false},
		{map[string]string{"OTEL_SERVICE_NAME": "x"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "console"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, false},
		{map[string]string{"OTEL_SDK_DISABLED": "TRUE", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, false},
		{map[string]string{"OTEL_SDK_DISABLED": "false", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, true},
	} {
		if got := Requested(func(k string) string { return tc.env[k] }); got != tc.want {
			t.Errorf("Requested(%v) = %v, want %v", tc.env, got, tc.want)
		}
	}
}

// FromEnv: no-op when not asked; an SDK provider naming the service when
// asked; an EnvError naming the variable for a value it cannot use.
func TestFromEnv(t *testing.T) {
	log := slog.New(slog.NewJSONHandler(io.Discard, nil))
	ctx := context.Background()

	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	p, err := FromEnv(ctx, log)
	if err != nil || p.Enabled {
		t.Fatalf("no OTEL_*: enabled %v, err %v; want the no-op provider", p != nil && p.Enabled, err)
	}

	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	t.Setenv("OTEL_SERVICE_NAME", "")
	if p, err = FromEnv(ctx, log); err != nil || p.Service != ServiceName {
		t.Fatalf("no OTEL_SERVICE_NAME: service %q, err %v; want %q", p.Service, err, ServiceName)
	}
	t.Setenv("OTEL_SERVICE_NAME", "relay-7")
	p, err = FromEnv(ctx, log)
	if err != nil || !p.Enabled || p.Service != "relay-7" {
		t.Fatalf("endpoint set: enabled %v, service %q, err %v; want on, relay-7", p != nil && p.Enabled, p.Service, err)
	}
	sctx, cancel := context.WithTimeout(ctx, 0)
	defer cancel()
	_ = p.Shutdown(sctx) // nothing to flush

	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon")
	_, err = FromEnv(ctx, log)
	var ee *EnvError
	if !errors.As(err, &ee) || ee.Var != "OTEL_EXPORTER_OTLP_PROTOCOL" {
		t.Fatalf("bad protocol: err %v, want an EnvError naming OTEL_EXPORTER_OTLP_PROTOCOL", err)
	}
}
