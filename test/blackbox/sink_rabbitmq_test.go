package blackbox

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Black-box tests of dispatch.sink=rabbitmq: the built binary publishes
// rows to a topic exchange of the test's own on the machine's RabbitMQ,
// read back from the test's queues.

// rabbitTestURL is the broker the tests use.
var rabbitTestURL = cmp.Or(os.Getenv("OUTBOXD_TEST_RABBITMQ_URL"), "amqp://guest:guest@127.0.0.1:5672/")

// rabbitExchange is a test's durable topic exchange and its queues,
// deleted at cleanup.
type rabbitExchange struct {
	t      *testing.T
	ch     *amqp.Channel
	name   string
	queues []string
}

func newRabbitExchange(t *testing.T) *rabbitExchange {
	t.Helper()
	conn, err := amqp.Dial(rabbitTestURL)
	if err != nil {
		t.Fatalf("connect to RabbitMQ (set OUTBOXD_TEST_RABBITMQ_URL): %v", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	rx := &rabbitExchange{t: t, ch: ch, name: "outboxd-bb-" + hex.EncodeToString(b)}
	if err := ch.ExchangeDeclare(rx.name, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, q := range rx.queues {
			_, _ = ch.QueueDelete(q, false, false, false)
		}
		_ = ch.ExchangeDelete(rx.name, false, false)
		_ = conn.Close()
	})
	return rx
}

// queue declares a durable queue bound with pattern.
func (rx *rabbitExchange) queue(pattern string) string {
	rx.t.Helper()
	name := rx.name + ".q" + strconv.Itoa(len(rx.queues))
	if _, err := rx.ch.QueueDeclare(name, true, false, false, false, nil); err != nil {
		rx.t.Fatal(err)
	}
	rx.queues = append(rx.queues, name)
	rx.bind(name, pattern)
	return name
}

func (rx *rabbitExchange) bind(queue, pattern string) {
	rx.t.Helper()
	if err := rx.ch.QueueBind(queue, pattern, rx.name, false, nil); err != nil {
		rx.t.Fatal(err)
	}
}

// drain takes every message the queue holds, in queue order.
func (rx *rabbitExchange) drain(queue string) []amqp.Delivery {
	rx.t.Helper()
	var out []amqp.Delivery
	for {
		d, ok, err := rx.ch.Get(queue, true)
		if err != nil {
			rx.t.Fatal(err)
		}
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

// rabbitEnv is a testBundle whose replica publishes to rx with the default
// routing key template (outbox.event.{aggregate_type}).
func rabbitEnv(t *testing.T, rx *rabbitExchange) *testBundle {
	e := setup(t)
	e.set("OUTBOXD_DISPATCH_SINK", "rabbitmq",
		"OUTBOXD_DISPATCH_RABBITMQ_URL", rabbitTestURL,
		"OUTBOXD_DISPATCH_RABBITMQ_EXCHANGE", rx.name)
	return e
}

// header is a message's header as a string ("" when absent).
func header(d amqp.Delivery, k string) string {
	s, _ := d.Headers[k].(string)
	return s
}

// rabbitMQCase: routing key outbox.event.order, the AMQP properties
// (message_id, type, content_type, persistent, timestamp), CloudEvents on
// (the AMQP binding's cloudEvents_ prefix), and the connection's log line.
func rabbitMQCase() sinkCase {
	var rx *rabbitExchange
	byID := map[string]amqp.Delivery{}
	return sinkCase{
		name: "rabbitmq", cePrefix: "cloudEvents_",
		setup: func(t *testing.T) (*testBundle, func(int) []delivered) {
			rx = newRabbitExchange(t)
			q := rx.queue("#")
			return rabbitEnv(t, rx), func(int) []delivered {
				var out []delivered
				for _, d := range rx.drain(q) {
					h := map[string]string{}
					for k := range d.Headers {
						h[k] = header(d, k)
					}
					byID[h["id"]] = d
					out = append(out, delivered{where: "message with key " + d.RoutingKey, headers: h, key: h["aggregate_id"], body: string(d.Body),
						contentType: d.ContentType})
				}
				return out
			}
		},
		check: func(t *testing.T, r *replica, _ []delivered) {
			for id, d := range byID {
				if d.RoutingKey != "outbox.event.order" || d.MessageId != id || d.Type != "test.event" || d.ContentType != "application/json" ||
					d.DeliveryMode != amqp.Persistent || d.Timestamp.IsZero() {
					t.Errorf("event %s: routing key %s message_id %q type %q content_type %q delivery_mode %d timestamp %v",
						id, d.RoutingKey, d.MessageId, d.Type, d.ContentType, d.DeliveryMode, d.Timestamp)
				}
			}
			if found := r.logsMatching(func(_ string, rec map[string]any) bool {
				return rec["msg"] == "rabbitmq connected" && rec["exchange"] == rx.name
			}); len(found) != 1 {
				t.Errorf("want one 'rabbitmq connected' line for %s, got %d; logs:\n%s", rx.name, len(found), r.tail(20))
			}
		},
	}
}

// TestRabbitMQSinkUnroutable: rows whose routing key no queue is bound to
// are retried with a readable last_error naming the exchange, the key and
// the fix, never marked dispatched; the other aggregates flow; once a
// queue is bound, the rows go through in order.
func TestRabbitMQSinkUnroutable(t *testing.T) {
	t.Parallel()
	rx := newRabbitExchange(t)
	rx.queue("outbox.event.order")
	orphanQ := rx.queue("nothing.yet")
	e := rabbitEnv(t, rx)
	e.set("OUTBOXD_POLLER_MAX_ATTEMPTS", "1000")
	var orphans []int64
	for i := range 4 {
		orphans = append(orphans, e.insert("orphan", strconv.Itoa(i%2), `{"o":`+strconv.Itoa(i)+`}`, ""))
	}
	flowing := e.insertMany("order", 5, 4)
	e.start()
	waitFor(t, "the other aggregates' rows dispatched", func() bool {
		return e.count("aggregate_type = 'order' AND dispatched_at IS NOT NULL") == len(flowing)
	}, e.describeRows("aggregate_type = 'order'"))
	waitFor(t, "the orphan rows retried with a readable last_error", func() bool {
		return e.count(`aggregate_type = 'orphan' AND attempts >= 2 AND last_error LIKE '%unroutable%'`) >= 2
	}, e.describeRows("aggregate_type = 'orphan'"))
	for _, w := range e.rows("aggregate_type = 'orphan'") {
		if w.Dispatched || w.Dead {
			t.Fatalf("orphan row settled: %s", w)
		}
		if w.Attempts > 0 && (!strings.Contains(w.LastError, strconv.Quote(rx.name)) ||
			!strings.Contains(w.LastError, `"outbox.event.orphan"`) || !strings.Contains(w.LastError, "bind a queue")) {
			t.Errorf("last_error does not name the exchange, the routing key and the fix: %s", w)
		}
	}
	t.Logf("last_error: %s", e.rows("aggregate_type = 'orphan' AND attempts > 0")[0].LastError)

	rx.bind(orphanQ, "outbox.event.orphan")
	waitFor(t, "the orphan rows dispatched once a queue is bound", func() bool {
		return e.count("aggregate_type = 'orphan' AND dispatched_at IS NOT NULL") == len(orphans)
	}, e.describeRows("aggregate_type = 'orphan'"))
	byAgg := map[string][]int64{}
	for _, d := range rx.drain(orphanQ) {
		id, _ := strconv.ParseInt(header(d, "id"), 10, 64)
		if agg := header(d, "aggregate_id"); !slices.Contains(byAgg[agg], id) {
			byAgg[agg] = append(byAgg[agg], id)
		}
	}
	want := map[string][]int64{"0": {orphans[0], orphans[2]}, "1": {orphans[1], orphans[3]}}
	for agg, ids := range want {
		if !slices.Equal(byAgg[agg], ids) {
			t.Errorf("aggregate orphan/%s: queue holds %v (first appearances), want %v", agg, byAgg[agg], ids)
		}
	}
}
