package app_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/app"
	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/dispatch/kafka"
	"github.com/outboxd/outboxd/dispatch/nats"
	"github.com/outboxd/outboxd/internal/metrics"
	"github.com/outboxd/outboxd/internal/testkit"
)

const routedYAML = `
dispatch:
  destinations:
    payments:
      sink: kafka
      kafka: {brokers: ["b1:9092"], topic: "payments.{event_type}"}
    notify:
      sink: webhook
      webhook: {url: "https://hooks.example.com/outbox"}
    audit:
      sink: nats
  routes:
    - {aggregate_type: "payment*", to: payments}
    - {event_type: "customer.notification.*", to: notify}
    - {aggregate_type: "audit", event_type: "*", to: audit}
`

// The contract's example loads: each destination gets its sink section's
// defaults, the routes keep their order, and without dispatch.sink the
// top-level section is not a destination (what no route matches is
// dead-lettered).
func TestRoutedConfigLoads(t *testing.T) {
	t.Parallel()
	c, err := app.LoadConfig(writeFile(t, routedYAML), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range c.Destinations() {
		names = append(names, d.Name+"="+d.Dispatch.Sink+"@"+d.Key)
	}
	if got := strings.Join(names, " "); got != "audit=nats@dispatch.destinations.audit notify=webhook@dispatch.destinations.notify payments=kafka@dispatch.destinations.payments" {
		t.Fatalf("destinations %s", got)
	}
	p := c.Dispatch.Destinations["payments"]
	if p.Kafka.Topic != "payments.{event_type}" || p.Kafka.ClientID != kafka.DefaultClientID || p.Kafka.Timeout != kafka.DefaultTimeout {
		t.Errorf("payments' kafka section %+v: want its topic and the defaults", p.Kafka)
	}
	if a := c.Dispatch.Destinations["audit"]; a.NATS.URL != nats.DefaultURL || a.NATS.Subject != nats.DefaultSubject {
		t.Errorf("audit's nats section %+v: want the defaults", a.NATS)
	}
	if w := c.Dispatch.Destinations["notify"].Webhook; w.Timeout != 10*time.Second {
		t.Errorf("notify's webhook timeout %s: want the effective default (10s with the default lease)", w.Timeout)
	}
	if len(c.Dispatch.Routes) != 3 || c.Dispatch.Routes[1] != (config.Route{EventType: "customer.notification.*", To: "notify"}) {
		t.Errorf("routes %+v", c.Dispatch.Routes)
	}

	// dispatch.sink set: the top-level section is the destination default.
	c, err = app.LoadConfig(writeFile(t, routedYAML+"  sink: webhook\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if ds := c.Destinations(); len(ds) != 4 || ds[0].Name != "default" || ds[0].Key != "dispatch" {
		t.Fatalf("with dispatch.sink: %+v, want default first", ds)
	}
	c, err = app.LoadConfig(writeFile(t, routedYAML), []string{"dispatch.sink=noop"})
	if err != nil || !c.TopLevelDestination() {
		t.Fatalf("dispatch.sink by --set: %v, top-level destination %v", err, c != nil && c.TopLevelDestination())
	}
	// No destinations: the single-sink configuration, unchanged.
	c, err = app.LoadConfig("", nil)
	if err != nil || len(c.Destinations()) != 1 || c.Destinations()[0].Dispatch.Sink != "webhook" {
		t.Fatalf("defaults: %v %+v", err, c.Destinations())
	}
}

// Each way to get routing wrong exits 2 naming the key.
func TestRoutingErrorsNameTheKey(t *testing.T) {
	t.Parallel()
	const dests = `
dispatch:
  destinations:
    notify: {sink: webhook}
    stream: {sink: redis_stream}
`
	for _, tc := range []struct {
		name, file string
		sets       []string
		key        string
	}{
		{name: "unknown destination in a route", file: dests + "  routes:\n    - {event_type: a, to: notify}\n    - {event_type: b, to: nowhere}\n", key: "dispatch.routes[1].to"},
		{name: "route to default without one", file: dests + "  routes:\n    - {event_type: a, to: default}\n", key: "dispatch.routes[0].to"},
		{name: "bad glob", file: dests + "  routes:\n    - {event_type: \"[a-\", to: notify}\n", key: "dispatch.routes[0].event_type"},
		{name: "bad aggregate glob", file: dests + "  routes:\n    - {aggregate_type: \"x\\\\\", to: notify}\n", key: "dispatch.routes[0].aggregate_type"},
		{name: "route without a matcher", file: dests + "  routes:\n    - {to: notify}\n", key: "dispatch.routes[0]"},
		{name: "route without to", file: dests + "  routes:\n    - {event_type: a}\n", key: "dispatch.routes[0].to"},
		{name: "route with an unknown key", file: dests + "  routes:\n    - {event_type: a, target: notify}\n", key: "dispatch.routes[0].target"},
		{name: "route value not a string", file: dests + "  routes:\n    - {event_type: [a, b], to: notify}\n", key: "dispatch.routes[0].event_type"},
		{name: "route not a map", file: dests + "  routes:\n    - notify\n", key: "dispatch.routes[0]"},
		{name: "routes not a list", file: dests + "  routes: notify\n", key: "dispatch.routes"},
		{name: "destination without a sink", file: dests + "    bare:\n      webhook: {url: \"http://h/x\"}\n", key: "dispatch.destinations.bare.sink"},
		{name: "destination with an unknown sink", file: dests + "    odd: {sink: pigeon}\n", key: "dispatch.destinations.odd.sink"},
		{name: "destination's bad setting", file: dests + "    bad: {sink: webhook, webhook: {url: \"ftp://x\"}}\n", key: "dispatch.destinations.bad.webhook.url"},
		{name: "destination's unknown key", file: dests + "    bad: {sink: webhook, webhook: {uri: \"http://x\"}}\n", key: "dispatch.destinations.bad.webhook.uri"},
		{name: "destination's wrong type", file: dests + "    bad: {sink: webhook, webhook: {timeout: soon}}\n", key: "dispatch.destinations.bad.webhook.timeout"},
		{name: "destination's kafka without brokers", file: dests + "    pay: {sink: kafka}\n", key: "dispatch.destinations.pay.kafka.brokers"},
		{name: "destination's template", file: dests + "    pay: {sink: nats, nats: {subject: \"{event_type}\"}}\n", key: "dispatch.destinations.pay.nats.subject"},
		{name: "nested destinations", file: dests + "    outer: {sink: noop, destinations: {inner: {sink: noop}}}\n", key: "dispatch.destinations.outer.destinations.inner.sink"},
		{name: "nested routes", file: dests + "    outer: {sink: noop, routes: []}\n", key: "dispatch.destinations.outer.routes"},
		{name: "bad name", file: dests + "    pay-ments: {sink: noop}\n", key: "dispatch.destinations.pay-ments"},
		{name: "default twice", file: dests + "    default: {sink: noop}\n  sink: webhook\n", key: "dispatch.destinations.default"},
		{name: "destinations not a map", file: "dispatch:\n  destinations: [a, b]\n", key: "dispatch.destinations"},
		{name: "destination's bad --set", file: dests, sets: []string{"dispatch.destinations.notify.webhook.url=ftp://x"}, key: "dispatch.destinations.notify.webhook.url"},
		{name: "destination's unknown --set", file: dests, sets: []string{"dispatch.destinations.notify.webhook.nope=1"}, key: "dispatch.destinations.notify.webhook.nope"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := app.LoadConfig(writeFile(t, tc.file), tc.sets)
			var ke *config.KeyError
			if !errors.As(err, &ke) || ke.Key != tc.key || !strings.Contains(err.Error(), tc.key) {
				t.Fatalf("got %v, want a KeyError naming %s", err, tc.key)
			}
		})
	}
}

// A named destination's keys are overridden by
// OUTBOXD_DISPATCH_DESTINATIONS_<NAME>_<KEY> and by --set, like the
// top-level ones. Not parallel: it sets OUTBOXD_* variables.
func TestDestinationEnvAndSetOverride(t *testing.T) {
	t.Setenv("OUTBOXD_DISPATCH_DESTINATIONS_NOTIFY_WEBHOOK_URL", "http://from-env/x")
	t.Setenv("OUTBOXD_DISPATCH_DESTINATIONS_PAYMENTS_KAFKA_BROKERS", "e1:9092,e2:9092")
	c, err := app.LoadConfig(writeFile(t, routedYAML), []string{"dispatch.destinations.audit.nats.subject=audit.{event_type}"})
	if err != nil {
		t.Fatal(err)
	}
	d := c.Dispatch.Destinations
	if d["notify"].Webhook.URL != "http://from-env/x" {
		t.Errorf("notify url %q, want the environment's", d["notify"].Webhook.URL)
	}
	if strings.Join(d["payments"].Kafka.Brokers, ",") != "e1:9092,e2:9092" {
		t.Errorf("payments brokers %q, want the environment's", d["payments"].Kafka.Brokers)
	}
	if d["audit"].NATS.Subject != "audit.{event_type}" {
		t.Errorf("audit subject %q, want the --set's", d["audit"].NATS.Subject)
	}
	if c.Dispatch.Webhook.URL != config.DefaultWebhookURL {
		t.Errorf("top-level url %q changed", c.Dispatch.Webhook.URL)
	}
}

// The effective configuration of a routed setup names no top-level sink
// unless dispatch.sink was set: the default one is no destination there.
func TestRoutedConfigShowsNoDefaultSink(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		file string
		want any
	}{
		{routedYAML, nil},
		{routedYAML + "  sink: nats\n", "nats"},
		{"", "webhook"},
	} {
		file := ""
		if tc.file != "" {
			file = writeFile(t, tc.file)
		}
		c, err := app.LoadConfig(file, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.Redacted()["dispatch"].(map[string]any)["sink"]; got != tc.want {
			t.Errorf("dispatch.sink shown as %v, want %v, for:%s", got, tc.want, tc.file)
		}
	}
}

// A destination may be named in the environment alone, by its sink's
// variable; its other keys come from the environment too. Not parallel: it
// sets OUTBOXD_* variables.
func TestDestinationFromTheEnvironmentAlone(t *testing.T) {
	t.Setenv("OUTBOXD_DISPATCH_DESTINATIONS_AUDIT_LOG_SINK", "webhook")
	t.Setenv("OUTBOXD_DISPATCH_DESTINATIONS_AUDIT_LOG_WEBHOOK_URL", "http://from-env/audit")
	c, err := app.LoadConfig(writeFile(t, "dispatch:\n  routes:\n    - {aggregate_type: audit, to: audit_log}\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	d := c.Dispatch.Destinations["audit_log"]
	if d == nil || d.Sink != "webhook" || d.Webhook.URL != "http://from-env/audit" || d.Webhook.Timeout != 10*time.Second {
		t.Fatalf("destination audit_log %+v: want the environment's webhook with the section's defaults", d)
	}
	if ds := c.Destinations(); len(ds) != 1 || ds[0].Key != "dispatch.destinations.audit_log" {
		t.Fatalf("destinations %+v: want audit_log alone", ds)
	}
}

// A destination's secrets are read from their files and redacted exactly
// like the top-level ones; an error about one names the destination's key.
func TestDestinationSecretsAreRedacted(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pw := filepath.Join(dir, "pw")
	if err := os.WriteFile(pw, []byte("kafka-canary\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := app.LoadConfig(writeFile(t, `
dispatch:
  destinations:
    notify:
      sink: webhook
      webhook: {url: "https://u:url-canary@h/x?token=tok-canary", secret: "whsec-canary"}
    pay:
      sink: kafka
      kafka: {brokers: ["b:9092"], sasl: {mechanism: PLAIN, username: u, password_file: `+pw+`}}
    q:
      sink: rabbitmq
      rabbitmq: {url: "amqp://guest:amqp-canary@h:5672/"}
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Dispatch.Destinations["pay"].Kafka.SASL.Password; got != "kafka-canary" {
		t.Fatalf("pay's password %q, want the file's", got)
	}
	out := strings.Join(flatten(c.Redacted()), " ")
	if strings.Contains(out, "canary") {
		t.Fatalf("redacted config shows a destination's secret: %s", out)
	}
	if !strings.Contains(out, "password_file="+pw) || !strings.Contains(out, "url=https://u:redacted@h/x?token=redacted") {
		t.Fatalf("redacted config lacks the destination's neighbours of its secrets: %s", out)
	}

	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = app.LoadConfig(writeFile(t, "dispatch:\n  destinations:\n    n: {sink: webhook, webhook: {secret_file: "+empty+"}}\n"), nil)
	var ke *config.KeyError
	if !errors.As(err, &ke) || ke.Key != "dispatch.destinations.n.webhook.secret_file" {
		t.Fatalf("empty secret file: %v, want a KeyError naming the destination's secret_file", err)
	}
	_, err = app.LoadConfig(writeFile(t, "dispatch:\n  destinations:\n    n: {sink: webhook, webhook: {secret: x, secret_file: "+pw+"}}\n"), nil)
	if !errors.As(err, &ke) || ke.Key != "dispatch.destinations.n.webhook.secret_file" {
		t.Fatalf("secret and secret_file: %v, want a KeyError naming the destination's secret_file", err)
	}
}

// The wiring: one default destination is its sink itself; with named
// destinations the sink is a Router over them following the routes, and
// every destination's series are exported at 0 from the start.
func TestSinkRoutesToTheDestinations(t *testing.T) {
	t.Parallel()
	c, err := app.LoadConfig(writeFile(t, `
dispatch:
  sink: noop
  destinations:
    hook: {sink: webhook, webhook: {url: "http://127.0.0.1:1/x"}}
    quiet: {sink: noop}
  routes:
    - {event_type: "*.notify", to: hook}
    - {aggregate_type: "audit", to: quiet}
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	a := &app.App{Cfg: c, Log: testkit.Logger(t), Metrics: metrics.New()}
	sink, err := a.Sink()
	if err != nil {
		t.Fatal(err)
	}
	defer app.CloseSink(sink)
	r, ok := sink.(*dispatch.Router)
	if !ok {
		t.Fatalf("sink %T, want a *dispatch.Router", sink)
	}
	for _, tc := range []struct{ at, et, want string }{
		{"order", "order.notify", "hook"}, {"audit", "audit.notify", "hook"}, {"audit", "x", "quiet"}, {"order", "order.paid", "default"},
	} {
		if got := r.DestinationOf(dispatch.Event{AggregateType: tc.at, EventType: tc.et}); got != tc.want {
			t.Errorf("(%s, %s) goes to %q, want %q", tc.at, tc.et, got, tc.want)
		}
	}
	for _, d := range []string{"default", "hook", "quiet"} {
		if v := testutil.ToFloat64(a.Metrics.Dispatched.WithLabelValues(d)); v != 0 {
			t.Errorf("%s: %v", d, v)
		}
	}
	if n := testutil.CollectAndCount(a.Metrics.Dispatched); n != 3 {
		t.Errorf("%d outboxd_dispatched_total series, want one per destination (3)", n)
	}

	c, err = app.LoadConfig("", []string{"dispatch.sink=noop"})
	if err != nil {
		t.Fatal(err)
	}
	a = &app.App{Cfg: c, Log: testkit.Logger(t), Metrics: metrics.New()}
	sink, err = a.Sink()
	if b, ok := sink.(*dispatch.Breaker); err != nil || !ok || b.State().Destination != "default" ||
		sink.Capabilities() != (dispatch.Noop{}).Capabilities() {
		t.Fatalf("single sink: %T %v, want the noop sink itself in the circuit breaker of default", sink, err)
	}
}
