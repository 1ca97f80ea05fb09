package rabbitmq

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"

	"github.com/outboxd/outboxd/internal/testkit"

	"github.com/outboxd/outboxd/dispatch"
)

// Tests run against a real RabbitMQ: OUTBOXD_TEST_RABBITMQ_URL, default
// the local broker. Each test declares its own exchange and queues (random
// names) and deletes them at cleanup, so tests and packages run in
// parallel against one broker.
var brokerURL = envOr("OUTBOXD_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")

func TestMain(m *testing.M) {
	conn, err := amqp.Dial(brokerURL)
	if err != nil {
		fmt.Fprintf(os.Stderr, "rabbitmq tests: cannot reach RabbitMQ at %s (%v): start it, or point OUTBOXD_TEST_RABBITMQ_URL at one\n", brokerHost(), err)
		os.Exit(1)
	}
	_ = conn.Close()
	// toxiproxy can leave a toxic's pipe blocked on a channel after its
	// proxy stopped (as in internal/testenv).
	testkit.VerifyTestMain(m)
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func brokerHost() string {
	u, err := amqp.ParseURI(brokerURL)
	if err != nil {
		return "?"
	}
	return fmt.Sprintf("%s:%d", u.Host, u.Port)
}

// urlVia is brokerURL with another host:port (a proxy, a dead port).
func urlVia(t *testing.T, hostport string) string {
	t.Helper()
	u, err := url.Parse(brokerURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = hostport
	return u.String()
}

func randomName(t testing.TB) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := strings.NewReplacer("/", "-", " ", "-").Replace(t.Name())
	return "outboxd-test-" + strings.ToLower(name) + "-" + hex.EncodeToString(b)
}

// admin is a test's own connection for setting up and reading the broker.
type admin struct {
	t        testing.TB
	conn     *amqp.Connection
	ch       *amqp.Channel
	exchange string // this test's exchange name
	queues   []string
}

// newAdmin connects and names the test's exchange; nothing is declared yet.
// At cleanup it deletes the exchange and the queues it declared.
func newAdmin(t testing.TB) *admin {
	t.Helper()
	conn, err := amqp.Dial(brokerURL)
	if err != nil {
		t.Fatal(err)
	}
	a := &admin{t: t, conn: conn, exchange: randomName(t)}
	a.ch = a.channel()
	t.Cleanup(func() {
		ch := a.channel()
		for _, q := range a.queues {
			_, _ = ch.QueueDelete(q, false, false, false)
		}
		_ = ch.ExchangeDelete(a.exchange, false, false)
		_ = conn.Close()
	})
	return a
}

func (a *admin) channel() *amqp.Channel {
	a.t.Helper()
	ch, err := a.conn.Channel()
	if err != nil {
		a.t.Fatal(err)
	}
	return ch
}

// declareExchange declares the test's exchange with kind.
func (a *admin) declareExchange(kind string) {
	a.t.Helper()
	if err := a.ch.ExchangeDeclare(a.exchange, kind, true, false, false, false, nil); err != nil {
		a.t.Fatal(err)
	}
}

func (a *admin) deleteExchange() {
	a.t.Helper()
	if err := a.ch.ExchangeDelete(a.exchange, false, false); err != nil {
		a.t.Fatal(err)
	}
}

// queue declares a queue bound to the exchange with pattern.
func (a *admin) queue(pattern string, args amqp.Table) string {
	a.t.Helper()
	name := fmt.Sprintf("%s.q%d", a.exchange, len(a.queues))
	if _, err := a.ch.QueueDeclare(name, true, false, false, false, args); err != nil {
		a.t.Fatal(err)
	}
	a.queues = append(a.queues, name)
	a.bind(name, pattern)
	return name
}

func (a *admin) bind(queue, pattern string) {
	a.t.Helper()
	if err := a.ch.QueueBind(queue, pattern, a.exchange, false, nil); err != nil {
		a.t.Fatal(err)
	}
}

// count is how many messages queue holds.
func (a *admin) count(queue string) int {
	a.t.Helper()
	q, err := a.ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		a.t.Fatal(err)
	}
	return q.Messages
}

// drain takes every message queue holds now (the sink's confirms came in:
// the broker has enqueued what it acked).
func (a *admin) drain(queue string) []amqp.Delivery {
	a.t.Helper()
	var out []amqp.Delivery
	for {
		d, ok, err := a.ch.Get(queue, true)
		if err != nil {
			a.t.Fatal(err)
		}
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

// waitCount waits until queue holds n messages.
func (a *admin) waitCount(queue string, n int) {
	a.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for a.count(queue) != n {
		if time.Now().After(deadline) {
			a.t.Fatalf("queue %s holds %d messages, want %d", queue, a.count(queue), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// logs is a JSON slog buffer a test can read.
type logs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logs) logger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// records are the log lines whose level is level, parsed.
func (l *logs) records(level string) []map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(l.buf.String(), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && rec["level"] == level {
			out = append(out, rec)
		}
	}
	return out
}

func (l *logs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// newSink builds a sink on the test's exchange, closed at cleanup.
func newSink(t testing.TB, cfg Config) *Sink {
	t.Helper()
	if cfg.URL == "" {
		cfg.URL = brokerURL
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// ev is an event with a small payload.
func ev(id int64, aggType, aggID, eventType string) dispatch.Event {
	return dispatch.Event{ID: id, AggregateType: aggType, AggregateID: aggID, EventType: eventType,
		Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, id)), Headers: json.RawMessage(`{}`),
		CreatedAt: time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)}
}

// batchOf is a batch with a trust deadline well ahead.
func batchOf(events ...dispatch.Event) dispatch.Batch {
	until := time.Now().Add(30 * time.Second)
	return dispatch.Batch{Events: events, Token: 7, Until: func() time.Time { return until }}
}

// send sends events and checks one result per event.
func send(t *testing.T, s *Sink, events ...dispatch.Event) []dispatch.Result {
	t.Helper()
	res := s.Send(context.Background(), batchOf(events...))
	if len(res) != len(events) {
		t.Fatalf("%d results for %d events", len(res), len(events))
	}
	return res
}

// wantOutcomes compares results with the outcomes wanted, by index.
func wantOutcomes(t *testing.T, res []dispatch.Result, want ...dispatch.Outcome) {
	t.Helper()
	for i, w := range want {
		if res[i].Outcome != w {
			t.Errorf("event #%d: %v (%v), want %v", i, res[i].Outcome, res[i].Err, w)
		}
	}
}

// allDelivered checks every result is Delivered with a delivery tag.
func allDelivered(t *testing.T, res []dispatch.Result) {
	t.Helper()
	for i, r := range res {
		if r.Outcome != dispatch.Delivered || !strings.HasPrefix(r.Ref, "delivery tag ") {
			t.Fatalf("event #%d: %v ref %q (%v), want delivered with a delivery tag", i, r.Outcome, r.Ref, r.Err)
		}
	}
}

// proxy is an in-process toxiproxy in front of the broker, listening on
// listen ("127.0.0.1:0" for any port). Stopped at cleanup.
func proxy(t *testing.T, listen string) *toxiproxy.Proxy {
	t.Helper()
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, "rabbitmq", listen, brokerHost())
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return p
}

// toxic adds a toxic (toxiproxy JSON attributes) to p; the returned func
// removes it.
func toxic(t *testing.T, p *toxiproxy.Proxy, name, kind, stream, attrs string) (remove func()) {
	t.Helper()
	js := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"toxicity":1,"attributes":%s}`, name, kind, stream, attrs)
	if _, err := p.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
		t.Fatal(err)
	}
	return func() { _ = p.Toxics.RemoveToxic(context.Background(), name) }
}
