package blackbox

import (
	"context"
	"strings"
	"testing"
	"time"
)

// Black-box tests: rendered destinations are validated before use.

// A template that starts with a placeholder is refused at start (exit 2
// naming the key) unless dispatch.allow_row_prefixed_destinations is set.
func TestRowPrefixedTemplatesAreRefusedAtLoad(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, c := range []struct{ sink, key, env, tmpl string }{
		{"nats", "dispatch.nats.subject", "OUTBOXD_DISPATCH_NATS_SUBJECT", "{aggregate_type}.{event_type}"},
		{"redis_stream", "dispatch.redis_stream.stream", "OUTBOXD_DISPATCH_REDIS_STREAM_STREAM", "{aggregate_type}"},
		{"rabbitmq", "dispatch.rabbitmq.routing_key", "OUTBOXD_DISPATCH_RABBITMQ_ROUTING_KEY", "{event_type}"},
		{"kafka", "dispatch.kafka.topic", "OUTBOXD_DISPATCH_KAFKA_TOPIC", "{aggregate_type}"},
	} {
		vars := map[string]string{}
		for k, v := range e.vars {
			vars[k] = v
		}
		vars["OUTBOXD_DISPATCH_SINK"] = c.sink
		vars[c.env] = c.tmpl
		vars["OUTBOXD_DISPATCH_KAFKA_BROKERS"] = "127.0.0.1:9092"
		res := runBinary(t, vars, 30*time.Second, "run")
		if res.code != 2 || !strings.Contains(res.stderr, c.key) || !strings.Contains(res.stderr, "allow_row_prefixed_destinations") {
			t.Errorf("%s with %q: want exit 2 naming %s and the key that allows it; got %s", c.sink, c.tmpl, c.key, res)
		}
	}
}

// With row-prefixed templates explicitly allowed, a row still cannot reach
// the broker's API (a NATS $JS.API subject that deleted a stream) or the
// relay's own keys (a Redis stream named lock:reconciliation or
// idempotency:notify:<id>): each such row is dead-lettered on its first
// attempt with the reason; the others flow.
func TestRowsCannotAddressTheBrokersAPI(t *testing.T) {
	t.Parallel()
	ns := newNATSStream(t, "*")
	e := natsEnv(t, ns)
	e.set("OUTBOXD_DISPATCH_NATS_SUBJECT", "{aggregate_type}.{event_type}",
		"OUTBOXD_DISPATCH_ALLOW_ROW_PREFIXED_DESTINATIONS", "true")
	ok := e.insertTyped(ns.prefix, "1", "created")
	del := e.insertTyped("$JS.API.STREAM", "1", "DELETE."+ns.name)
	purge := e.insertTyped("$JS.API.STREAM", "2", "PURGE."+ns.name)
	e.start()
	waitFor(t, "the ordinary row dispatched and the API rows dead", func() bool {
		return e.row(ok).Dispatched && e.row(del).Dead && e.row(purge).Dead
	}, e.describeRows("true"))
	for _, id := range []int64{del, purge} {
		if w := e.row(id); w.Attempts != 1 || !strings.Contains(w.LastError, "$JS") {
			t.Errorf("API row: want dead on its first attempt naming the $ subject; got %s", w)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := ns.js.Stream(ctx, ns.name)
	if err != nil {
		t.Fatalf("the stream %s is gone: %v", ns.name, err)
	}
	if info, err := st.Info(ctx); err != nil || info.State.Msgs != 1 {
		t.Fatalf("stream %s: %v messages (%v), want the ordinary row's 1", ns.name, info, err)
	}
}

func TestRowsCannotAddressTheRelaysKeys(t *testing.T) {
	t.Parallel()
	e := redisStreamEnv(t)
	e.set("OUTBOXD_DISPATCH_REDIS_STREAM_STREAM", "{aggregate_type}",
		"OUTBOXD_DISPATCH_ALLOW_ROW_PREFIXED_DESTINATIONS", "true")
	ok := e.insert("orders", "1", `{}`, "")
	lockRow := e.insert("lock:reconciliation", "1", `{}`, "")
	idemRow := e.insert("idempotency:notify:1000", "1", `{}`, "")
	e.start()
	waitFor(t, "the ordinary row dispatched and the key-space rows dead", func() bool {
		return e.row(ok).Dispatched && e.row(lockRow).Dead && e.row(idemRow).Dead
	}, e.describeRows("true"))
	for _, id := range []int64{lockRow, idemRow} {
		if w := e.row(id); w.Attempts != 1 || !strings.Contains(w.LastError, "key space") {
			t.Errorf("key-space row: want dead on its first attempt naming the key space; got %s", w)
		}
	}
	for _, k := range []string{"lock:reconciliation", "idempotency:notify:1000"} {
		if typ := e.rdb.Type(context.Background(), e.prefix+k).Val(); typ == "stream" {
			t.Errorf("%s%s became a stream", e.prefix, k)
		}
	}
	// The reconciliation lock still works: its key is not a stream.
	if res := runBinary(t, e.vars, 30*time.Second, "reconcile", "--once"); res.code != 0 {
		t.Errorf("reconcile --once after the rows: %s", res)
	}
}

// insertTyped adds one row with an event type of the test's choosing.
func (e *testBundle) insertTyped(aggType, aggID, eventType string) int64 {
	e.t.Helper()
	var id int64
	err := e.pool.QueryRow(context.Background(),
		`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ($1, $2, $3, '{}') RETURNING id`,
		aggType, aggID, eventType).Scan(&id)
	if err != nil {
		e.t.Fatalf("insert %s/%s: %v", aggType, aggID, err)
	}
	return id
}
