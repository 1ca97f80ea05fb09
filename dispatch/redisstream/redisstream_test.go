package redisstream_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/dispatch/redisstream"
	"github.com/outboxd/outboxd/internal/cetest"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/internal/testkit"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// ---- helpers ----

// newSink builds a sink over client with cfg's other fields; it logs to logs
// (and to t.Log) and is closed at cleanup.
func newSink(t *testing.T, client redis.UniversalClient, cfg redisstream.Config, logs io.Writer) *redisstream.Sink {
	t.Helper()
	cfg.Client = client
	if logs == nil {
		logs = io.Discard
	}
	cfg.Log = slog.New(slog.NewJSONHandler(io.MultiWriter(logs, testkit.Writer(t)), &slog.HandlerOptions{Level: slog.LevelDebug}))
	s, err := redisstream.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// event is a row of aggregate typ/id with event type "<typ>.changed".
func event(id int64, typ, agg string) dispatch.Event {
	return dispatch.Event{ID: id, AggregateType: typ, AggregateID: agg, EventType: typ + ".changed",
		Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, id)), Headers: json.RawMessage(`{}`),
		CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)}
}

// batch is events under token 7 with a trust deadline a minute away.
func batch(events ...dispatch.Event) dispatch.Batch {
	until := time.Now().Add(time.Minute)
	return dispatch.Batch{Events: events, Token: 7, Until: func() time.Time { return until }}
}

// entry is a stream entry as Redis stores it: field-value pairs in order,
// duplicates kept (go-redis' XMessage is a map and would hide both).
type entry struct {
	ID     string
	Fields [][2]string
}

func (e entry) field(name string) (string, bool) {
	for _, f := range e.Fields {
		if f[0] == name {
			return f[1], true
		}
	}
	return "", false
}

// xrange reads every entry of key.
func xrange(t *testing.T, c redis.UniversalClient, key string) []entry {
	t.Helper()
	raw, err := c.Do(context.Background(), "XRANGE", key, "-", "+").Slice()
	if err != nil {
		t.Fatalf("XRANGE %s: %v", key, err)
	}
	out := make([]entry, len(raw))
	for i, r := range raw {
		pair := r.([]any)
		out[i].ID = pair[0].(string)
		kv := pair[1].([]any)
		for j := 0; j+1 < len(kv); j += 2 {
			out[i].Fields = append(out[i].Fields, [2]string{kv[j].(string), kv[j+1].(string)})
		}
	}
	return out
}

// ids are the entries' id fields.
func ids(t *testing.T, es []entry) []int64 {
	t.Helper()
	out := make([]int64, len(es))
	for i, e := range es {
		v, _ := e.field("id")
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("entry %s: id field %q: %v", e.ID, v, err)
		}
		out[i] = n
	}
	return out
}

// outcomes renders results for failure messages.
func outcomes(rs []dispatch.Result) string {
	var b strings.Builder
	for i, r := range rs {
		fmt.Fprintf(&b, "  [%d] %s ref=%q cut=%v err=%v\n", i, r.Outcome, r.Ref, r.Cut, r.Err)
	}
	return b.String()
}

func wantOutcomes(t *testing.T, rs []dispatch.Result, want ...dispatch.Outcome) {
	t.Helper()
	if len(rs) != len(want) {
		t.Fatalf("%d results, want %d:\n%s", len(rs), len(want), outcomes(rs))
	}
	for i := range want {
		if rs[i].Outcome != want[i] {
			t.Fatalf("result %d is %s, want %s; all:\n%s", i, rs[i].Outcome, want[i], outcomes(rs))
		}
	}
}

func allOutcomes(n int, o dispatch.Outcome) []dispatch.Outcome {
	out := make([]dispatch.Outcome, n)
	for i := range out {
		out[i] = o
	}
	return out
}

// ---- mapping ----

// TestMapping: an entry carries the contract's fields in order, the row's
// headers that do not collide, and the payload bytes as is; the key comes
// from the template after the key prefix; Ref is the entry id.
func TestMapping(t *testing.T) {
	t.Parallel()
	c, prefix := testenv.Redis(t)
	var logs testkit.Logs
	s := newSink(t, c, redisstream.Config{Stream: "orders.{aggregate_type}.{event_type}", KeyPrefix: prefix, MaxLen: 1000}, &logs)
	ev := event(41, "deal", "42")
	ev.EventType = "deal.funded"
	ev.Payload = json.RawMessage(`{"amount": 10,   "tags":["a","b"], "s":"ü\"x"}`) // spacing kept: bytes as is
	ev.Headers = json.RawMessage(`{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",` +
		`"id":"evil","payload":"evil","Aggregate_ID":"evil","attempt":3,"tenant":"acme"}`)
	rs := s.Send(context.Background(), batch(ev))
	wantOutcomes(t, rs, dispatch.Delivered)

	key := prefix + "orders.deal.deal.funded"
	es := xrange(t, c, key)
	if len(es) != 1 {
		t.Fatalf("stream %s has %d entries, want 1", key, len(es))
	}
	if rs[0].Ref != es[0].ID {
		t.Errorf("Ref %q, want the entry id %q", rs[0].Ref, es[0].ID)
	}
	want := [][2]string{
		{"id", "41"}, {"aggregate_type", "deal"}, {"aggregate_id", "42"}, {"event_type", "deal.funded"},
		{"created_at", "2026-01-02T03:04:05.000006Z"}, {"fencing_token", "7"},
		{"attempt", "3"}, {"tenant", "acme"}, {"traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
		{"payload", string(ev.Payload)},
	}
	if fmt.Sprint(es[0].Fields) != fmt.Sprint(want) {
		t.Errorf("fields\n got %q\nwant %q", es[0].Fields, want)
	}
	// One warning for the batch, naming the event and what was dropped.
	line := logs.WaitLine(t, 5*time.Second, "row headers dropped")
	for _, s := range []string{`"level":"WARN"`, `"outbox_id":41`, `"Aggregate_ID"`, `"id"`, `"payload"`} {
		if !strings.Contains(line, s) {
			t.Errorf("warning %s lacks %s", line, s)
		}
	}
}

// TestCloudEvents: with CloudEvents on, the ce- attributes follow the
// headers; off, none is written.
func TestCloudEvents(t *testing.T) {
	t.Parallel()
	c, prefix := testenv.Redis(t)
	on := newSink(t, c, redisstream.Config{Stream: "ce.on", KeyPrefix: prefix,
		CloudEvents: dispatch.CloudEvents{Enabled: true, Source: "urn:billing"}}, nil)
	off := newSink(t, c, redisstream.Config{Stream: "ce.off", KeyPrefix: prefix}, nil)
	ev := event(5, "deal", "1")
	wantOutcomes(t, on.Send(context.Background(), batch(ev)), dispatch.Delivered)
	wantOutcomes(t, off.Send(context.Background(), batch(ev)), dispatch.Delivered)

	got := xrange(t, c, prefix+"ce.on")[0]
	for k, v := range map[string]string{"ce-specversion": "1.0", "ce-id": "5", "ce-source": "urn:billing",
		"ce-type": "deal.changed", "ce-time": "2026-01-02T03:04:05.000006Z", "ce-aggregatetype": "deal", "ce-aggregateid": "1",
		"ce-datacontenttype": "application/json", "payload": `{"n":5}`} {
		if g, ok := got.field(k); !ok || g != v {
			t.Errorf("CloudEvents on: field %s = %q (present %v), want %q", k, g, ok, v)
		}
	}
	for _, f := range xrange(t, c, prefix+"ce.off")[0].Fields {
		if strings.HasPrefix(f[0], "ce-") {
			t.Errorf("CloudEvents off: field %s written", f[0])
		}
	}
}

// TestCloudEventsDecodeWithTheSDK: Redis Streams has no CloudEvents
// binding; outboxd's follows the NATS one without percent-encoding (fields
// are binary-safe): ce- fields with ce-datacontenttype, or a content-type
// field naming the event format with the event in payload. In both modes
// the entry decodes so with the CloudEvents SDK to the row's event.
func TestCloudEventsDecodeWithTheSDK(t *testing.T) {
	t.Parallel()
	c, prefix := testenv.Redis(t)
	for _, mode := range []string{dispatch.CloudEventsBinary, dispatch.CloudEventsStructured} {
		s := newSink(t, c, redisstream.Config{Stream: "ce." + mode, KeyPrefix: prefix,
			CloudEvents: dispatch.CloudEvents{Enabled: true, Source: "urn:billing eu", Mode: mode}}, nil)
		ev := event(6, "deal", "1 €")
		ev.EventType = "deal changed"
		wantOutcomes(t, s.Send(context.Background(), batch(ev)), dispatch.Delivered)
		h := map[string]string{}
		for _, f := range xrange(t, c, prefix+"ce."+mode)[0].Fields {
			h[f[0]] = f[1]
		}
		got, err := cetest.Decode(cetest.Message{Prefix: "ce-", ContentType: h["content-type"],
			Headers: h, Body: []byte(h[redisstream.PayloadField])})
		if err != nil {
			t.Fatalf("%s: the SDK cannot decode %v: %v", mode, h, err)
		}
		if err := cetest.Check(got, cetest.Want{ID: 6, Source: "urn:billing eu", Type: "deal changed",
			Time: ev.CreatedAt, AggregateType: "deal", AggregateID: "1 €", Data: string(ev.Payload)}); err != nil {
			t.Errorf("%s: decoded %s\n%v", mode, got, err)
		}
		if h["id"] != "6" || h["aggregate_id"] != "1 €" {
			t.Errorf("%s: fields %v: the contract's mapping is kept in every mode", mode, h)
		}
	}
}

// ---- results ----

// TestOrderAndRefs: many aggregates over two streams in one Send: each
// result Delivered with the entry id as Ref, each stream in batch order.
func TestOrderAndRefs(t *testing.T) {
	t.Parallel()
	c, prefix := testenv.Redis(t)
	s := newSink(t, c, redisstream.Config{Stream: "{aggregate_type}", KeyPrefix: prefix}, nil)
	var events []dispatch.Event
	wantIDs := map[string][]int64{}
	for i := range 60 {
		typ := []string{"deal", "user"}[i%2]
		ev := event(int64(100+i), typ, strconv.Itoa(i%7))
		events = append(events, ev)
		wantIDs[typ] = append(wantIDs[typ], ev.ID)
	}
	rs := s.Send(context.Background(), batch(events...))
	wantOutcomes(t, rs, allOutcomes(len(events), dispatch.Delivered)...)
	refs := map[string]int64{} // stream/Ref -> event id (entry ids repeat across streams)
	for i, r := range rs {
		refs[events[i].AggregateType+"/"+r.Ref] = events[i].ID
	}
	for typ, want := range wantIDs {
		es := xrange(t, c, prefix+typ)
		if got := ids(t, es); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("stream %s ids %v, want %v", typ, got, want)
		}
		for _, e := range es {
			if id, _ := e.field("id"); strconv.FormatInt(refs[typ+"/"+e.ID], 10) != id {
				t.Errorf("stream %s entry %s (id %s) is not the Ref of that event", typ, e.ID, id)
			}
		}
	}
}

// TestMaxLen: MAXLEN ~ keeps a stream near its limit: never below it, never
// a whole node of entries above it; 0 trims nothing.
func TestMaxLen(t *testing.T) {
	t.Parallel()
	c, prefix := testenv.Redis(t)
	const maxLen = 100
	trimmed := newSink(t, c, redisstream.Config{Stream: "trimmed", KeyPrefix: prefix, MaxLen: maxLen}, nil)
	untrimmed := newSink(t, c, redisstream.Config{Stream: "untrimmed", KeyPrefix: prefix}, nil)
	const total = 2000
	for from := 0; from < total; from += 500 {
		var events []dispatch.Event
		for i := from; i < from+500; i++ {
			events = append(events, event(int64(i+1), "deal", strconv.Itoa(i)))
		}
		wantOutcomes(t, trimmed.Send(context.Background(), batch(events...)), allOutcomes(500, dispatch.Delivered)...)
		wantOutcomes(t, untrimmed.Send(context.Background(), batch(events...)), allOutcomes(500, dispatch.Delivered)...)
	}
	cfg, err := c.ConfigGet(context.Background(), "stream-node-max-entries").Result()
	if err != nil {
		t.Fatal(err)
	}
	node, _ := strconv.Atoi(cfg["stream-node-max-entries"])
	n := c.XLen(context.Background(), prefix+"trimmed").Val()
	if n < maxLen || n >= int64(maxLen+node) {
		t.Errorf("trimmed stream has %d entries, want %d to %d (MAXLEN ~ %d, %d entries per node)", n, maxLen, maxLen+node-1, maxLen, node)
	}
	if n := c.XLen(context.Background(), prefix+"untrimmed").Val(); n != total {
		t.Errorf("untrimmed stream has %d entries, want %d", n, total)
	}
	// The newest entries are the ones kept.
	last := xrange(t, c, prefix+"trimmed")
	if got := ids(t, last[len(last)-1:]); got[0] != total {
		t.Errorf("last entry is event %d, want %d", got[0], total)
	}
}

// TestWrongType: a stream key holding another type fails only the events
// bound for it (Retryable, naming the key); the other aggregates' events in
// the same batch are Delivered.
func TestWrongType(t *testing.T) {
	t.Parallel()
	c, prefix := testenv.Redis(t)
	s := newSink(t, c, redisstream.Config{Stream: "{aggregate_type}", KeyPrefix: prefix}, nil)
	if err := c.Set(context.Background(), prefix+"blocked", "not a stream", 0).Err(); err != nil {
		t.Fatal(err)
	}
	rs := s.Send(context.Background(), batch(
		event(1, "blocked", "a"), event(2, "ok", "a"), event(3, "blocked", "b"), event(4, "ok", "b"), event(5, "blocked", "a")))
	wantOutcomes(t, rs, dispatch.Retryable, dispatch.Delivered, dispatch.Retryable, dispatch.Delivered, dispatch.NotAttempted)
	for _, i := range []int{0, 2} {
		msg := fmt.Sprint(rs[i].Err)
		if !strings.Contains(msg, "WRONGTYPE") || !strings.Contains(msg, strconv.Quote(prefix+"blocked")) || rs[i].Cut {
			t.Errorf("result %d: err %q cut %v; want WRONGTYPE naming the key, not cut", i, msg, rs[i].Cut)
		}
	}
	if got := ids(t, xrange(t, c, prefix+"ok")); fmt.Sprint(got) != "[2 4]" {
		t.Errorf("stream ok holds %v, want [2 4]", got)
	}
}

// TestPrefixRule: a failure in the middle of an aggregate (its events span
// streams through {event_type}) makes its later events NotAttempted, even
// the one Redis appended; another aggregate's events are unaffected.
func TestPrefixRule(t *testing.T) {
	t.Parallel()
	c, prefix := testenv.Redis(t)
	s := newSink(t, c, redisstream.Config{Stream: "{event_type}", KeyPrefix: prefix}, nil)
	if err := c.Set(context.Background(), prefix+"bad", "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	ev := func(id int64, agg, typ string) dispatch.Event {
		e := event(id, "deal", agg)
		e.EventType = typ
		return e
	}
	rs := s.Send(context.Background(), batch(
		ev(1, "A", "good"), ev(2, "B", "good"), ev(3, "A", "bad"), ev(4, "A", "good"), ev(5, "B", "good")))
	wantOutcomes(t, rs, dispatch.Delivered, dispatch.Delivered, dispatch.Retryable, dispatch.NotAttempted, dispatch.Delivered)
	if rs[3].Ref != "" || rs[3].Err != nil {
		t.Errorf("NotAttempted result carries ref %q err %v", rs[3].Ref, rs[3].Err)
	}
	// Documented: Redis did take event 4; it is sent again later and
	// consumers dedupe on the id field.
	if got := ids(t, xrange(t, c, prefix+"good")); fmt.Sprint(got) != "[1 2 4 5]" {
		t.Errorf("stream good holds %v, want [1 2 4 5]", got)
	}
}

// TestServerRefusals: OOM and READONLY replies are Retryable and name the
// stream; once the server accepts writes again the same sink delivers.
func TestServerRefusals(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedisServer(t)
	c := srv.Client()
	s := newSink(t, c, redisstream.Config{Stream: "refused"}, nil)
	ctx := context.Background()
	cases := []struct {
		name, code string
		refuse     []any
		accept     []any
	}{
		{"out of memory", "OOM", []any{"CONFIG", "SET", "maxmemory", "1"}, []any{"CONFIG", "SET", "maxmemory", "0"}},
		// A replica of a primary that is not there: writes are refused.
		{"read-only replica", "READONLY", []any{"REPLICAOF", "127.0.0.1", strconv.Itoa(testenv.FreePort(t))}, []any{"REPLICAOF", "NO", "ONE"}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := c.Do(ctx, tc.refuse...).Err(); err != nil {
				t.Fatal(err)
			}
			rs := s.Send(ctx, batch(event(int64(10*i+1), "deal", "1"), event(int64(10*i+2), "deal", "2")))
			wantOutcomes(t, rs, dispatch.Retryable, dispatch.Retryable)
			for _, r := range rs {
				if msg := r.Err.Error(); !strings.Contains(msg, tc.code) || !strings.Contains(msg, `"refused"`) || r.Cut {
					t.Errorf("err %q cut %v; want %s naming the stream, not cut", msg, r.Cut, tc.code)
				}
			}
			if err := c.Do(ctx, tc.accept...).Err(); err != nil {
				t.Fatal(err)
			}
			wantOutcomes(t, s.Send(ctx, batch(event(int64(10*i+3), "deal", "1"))), dispatch.Delivered)
		})
	}
}

// TestACL: a user allowed XADD on some keys only: a denied key is
// Retryable (NOPERM, naming the key, never the password); a refused INFO
// leaves delivery alone and is logged once.
func TestACL(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedisServer(t)
	admin := srv.Client()
	ctx := context.Background()
	if err := admin.Do(ctx, "ACL", "SETUSER", "relay", "on", ">s3cret-pw", "~allowed.*", "+xadd", "+ping", "+hello", "+client").Err(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "relay", Password: "s3cret-pw", ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	var logs testkit.Logs
	s := newSink(t, c, redisstream.Config{Stream: "{aggregate_type}.events"}, &logs)
	rs := s.Send(ctx, batch(event(1, "allowed", "1"), event(2, "denied", "1")))
	wantOutcomes(t, rs, dispatch.Delivered, dispatch.Retryable)
	if msg := rs[1].Err.Error(); !strings.Contains(msg, "NOPERM") || !strings.Contains(msg, `"denied.events"`) || strings.Contains(msg, "s3cret") {
		t.Errorf("denied: %q; want NOPERM naming the key, without the password", msg)
	}
	logs.WaitLine(t, 5*time.Second, "INFO server refused")
	wantOutcomes(t, s.Send(ctx, batch(event(3, "allowed", "1"))), dispatch.Delivered)
	if n := logs.Count("INFO server refused"); n != 1 {
		t.Errorf("%d INFO refusal lines, want 1 (asked once)", n)
	}
}

// ---- deadline ----

// TestDeadlinePassed: a batch whose trust deadline has passed, or whose
// context has ended, publishes nothing: all NotAttempted.
func TestDeadlinePassed(t *testing.T) {
	t.Parallel()
	c, prefix := testenv.Redis(t)
	s := newSink(t, c, redisstream.Config{Stream: "late", KeyPrefix: prefix}, nil)
	b := batch(event(1, "deal", "1"), event(2, "deal", "2"))
	past := time.Now().Add(-time.Millisecond)
	b.Until = func() time.Time { return past }
	wantOutcomes(t, s.Send(context.Background(), b), dispatch.NotAttempted, dispatch.NotAttempted)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	wantOutcomes(t, s.Send(ctx, batch(event(3, "deal", "1"))), dispatch.NotAttempted)
	if n := c.Exists(context.Background(), prefix+"late").Val(); n != 0 {
		t.Errorf("the stream exists: something was published past the deadline")
	}
}

// TestDeadlineMidSend: a server that stops answering (SIGSTOP) leaves the
// replies unreceived when the deadline comes: every event is Retryable and
// Cut, and Send returns; after the server resumes the same sink delivers.
func TestDeadlineMidSend(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedisServer(t)
	s := newSink(t, srv.Client(), redisstream.Config{Stream: "paused"}, nil)
	// Warm the connection, so the cut falls on a reply, not on a dial.
	wantOutcomes(t, s.Send(context.Background(), batch(event(1, "deal", "1"))), dispatch.Delivered)
	srv.Pause()
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			srv.Resume()
		}
	})
	b := batch(event(2, "deal", "1"), event(3, "deal", "2"), event(4, "user", "1"))
	until := time.Now().Add(300 * time.Millisecond)
	b.Until = func() time.Time { return until }
	rs := s.Send(context.Background(), b)
	// Per aggregate: deal/1, deal/2 and user/1 are each one event here.
	wantOutcomes(t, rs, dispatch.Retryable, dispatch.Retryable, dispatch.Retryable)
	for i, r := range rs {
		if !r.Cut {
			t.Errorf("result %d not Cut: %v", i, r.Err)
		}
	}
	srv.Resume()
	resumed = true
	wantOutcomes(t, s.Send(context.Background(), batch(event(5, "deal", "1"))), dispatch.Delivered)
}

// ---- outage ----

// TestOutage: a server down at New (New succeeds) makes Send Retryable,
// naming the stream; the same sink delivers once it is up, fails again
// when it goes away and recovers again when it is back.
func TestOutage(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedisServer(t)
	srv.Stop()
	s := newSink(t, srv.Client(), redisstream.Config{Stream: "outage"}, nil)
	down := func(id int64) {
		t.Helper()
		rs := s.Send(context.Background(), batch(event(id, "deal", "1"), event(id+1, "deal", "2")))
		wantOutcomes(t, rs, dispatch.Retryable, dispatch.Retryable)
		t.Logf("server down: %v", rs[0].Err)
		for _, r := range rs {
			if !strings.Contains(r.Err.Error(), `"outage"`) || r.Cut {
				t.Errorf("err %q cut %v; want one naming the stream, not cut", r.Err, r.Cut)
			}
		}
	}
	down(1)
	srv.Start()
	wantOutcomes(t, s.Send(context.Background(), batch(event(3, "deal", "1"))), dispatch.Delivered)
	srv.Stop()
	down(4)
	srv.Start()
	wantOutcomes(t, s.Send(context.Background(), batch(event(6, "deal", "1"), event(7, "deal", "2"))),
		dispatch.Delivered, dispatch.Delivered)
	if got := ids(t, xrange(t, srv.Client(), "outage")); fmt.Sprint(got) != "[6 7]" { // no persistence: the restart lost 3
		t.Errorf("stream holds %v, want [6 7]", got)
	}
}

// ---- cluster ----

// TestCluster: through a Cluster client, streams in different slots (on
// different nodes) each receive their events in order; a WRONGTYPE on one
// key fails only its aggregate.
func TestCluster(t *testing.T) {
	t.Parallel()
	addrs := testenv.StartRedisCluster(t, 3)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	s := newSink(t, c, redisstream.Config{Stream: "outbox.{aggregate_type}", KeyPrefix: "p:"}, nil)
	ctx := context.Background()
	types := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	nodes := map[string]bool{}
	for _, typ := range types {
		slot := c.ClusterKeySlot(ctx, "p:outbox."+typ).Val()
		nodes[nodeOf(t, c, slot)] = true
	}
	if len(nodes) < 2 {
		t.Fatalf("the stream keys all live on one node; choose other names")
	}
	if err := c.Set(ctx, "p:outbox.h", "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	var events []dispatch.Event
	want := map[string][]int64{}
	for i := range 80 {
		typ := types[i%len(types)]
		events = append(events, event(int64(i+1), typ, "1"))
		want[typ] = append(want[typ], int64(i+1))
	}
	rs := s.Send(ctx, batch(events...))
	for i, r := range rs {
		wantOutcome := dispatch.Delivered
		switch {
		case events[i].AggregateType == "h" && i == 7:
			wantOutcome = dispatch.Retryable
		case events[i].AggregateType == "h":
			wantOutcome = dispatch.NotAttempted
		}
		if r.Outcome != wantOutcome {
			t.Fatalf("event %d (%s): %s, want %s:\n%s", events[i].ID, events[i].AggregateType, r.Outcome, wantOutcome, outcomes(rs))
		}
	}
	for _, typ := range types[:len(types)-1] {
		if got := ids(t, xrange(t, c, "p:outbox."+typ)); fmt.Sprint(got) != fmt.Sprint(want[typ]) {
			t.Errorf("stream %s holds %v, want %v", typ, got, want[typ])
		}
	}
}

// nodeOf is the address of the master serving slot.
func nodeOf(t *testing.T, c *redis.ClusterClient, slot int64) string {
	t.Helper()
	shards, err := c.ClusterShards(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, sh := range shards {
		for _, r := range sh.Slots {
			if slot >= r.Start && slot <= r.End {
				return fmt.Sprint(sh.Nodes)
			}
		}
	}
	t.Fatalf("slot %d unserved", slot)
	return ""
}

// ---- the rest of the contract ----

// TestConcurrentSends: Sends from several goroutines at once all deliver,
// each stream in its batch's order.
func TestConcurrentSends(t *testing.T) {
	t.Parallel()
	c, prefix := testenv.Redis(t)
	s := newSink(t, c, redisstream.Config{Stream: "{aggregate_type}", KeyPrefix: prefix}, nil)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			var events []dispatch.Event
			for i := range 50 {
				events = append(events, event(int64(g*1000+i), "g"+strconv.Itoa(g), "1"))
			}
			for i, r := range s.Send(context.Background(), batch(events...)) {
				if r.Outcome != dispatch.Delivered {
					t.Errorf("goroutine %d event %d: %s %v", g, i, r.Outcome, r.Err)
				}
			}
		})
	}
	wg.Wait()
	for g := range 4 {
		got := ids(t, xrange(t, c, prefix+"g"+strconv.Itoa(g)))
		if len(got) != 50 || got[0] != int64(g*1000) || got[49] != int64(g*1000+49) {
			t.Errorf("stream g%d holds %v", g, got)
		}
	}
}

// TestClose: after Close, Send fails Retryable without sending; Close twice
// is fine; the caller's client stays open.
func TestClose(t *testing.T) {
	t.Parallel()
	c, prefix := testenv.Redis(t)
	s := newSink(t, c, redisstream.Config{Stream: "closed", KeyPrefix: prefix}, nil)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	rs := s.Send(context.Background(), batch(event(1, "deal", "1")))
	wantOutcomes(t, rs, dispatch.Retryable)
	if c.Exists(context.Background(), prefix+"closed").Val() != 0 {
		t.Error("a closed sink wrote")
	}
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Errorf("the client was closed with the sink: %v", err)
	}
}

// TestNew: New refuses a Config that cannot work and contacts nobody.
func TestNew(t *testing.T) {
	t.Parallel()
	nowhere := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t)), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = nowhere.Close() })
	untimed := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = untimed.Close() })
	for _, tc := range []struct {
		name string
		cfg  redisstream.Config
		want string // "" = accepted
	}{
		{"defaults, server down", redisstream.Config{Client: nowhere}, ""},
		{"no client", redisstream.Config{}, "no Redis client"},
		{"bad template", redisstream.Config{Client: nowhere, Stream: "x.{tenant}"}, "unknown placeholder"},
		{"unclosed template", redisstream.Config{Client: nowhere, Stream: "x.{aggregate_type"}, "unclosed"},
		{"negative maxlen", redisstream.Config{Client: nowhere, MaxLen: -1}, "maxlen"},
		{"commands not bounded by context", redisstream.Config{Client: untimed}, "ContextTimeoutEnabled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := redisstream.New(tc.cfg)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("New: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("New: %v, want an error with %q", err, tc.want)
			}
			if s != nil {
				if caps := s.Capabilities(); caps.DedupeWindow != 0 || caps.MaxBatch != 0 || caps.Ordering != "per stream (append order)" {
					t.Errorf("capabilities %+v", caps)
				}
				_ = s.Close()
			}
		})
	}
}

// TestServerVersion: the server's version is read once (it rides along
// with the first batch) and logged with whether XADD IDMP exists.
func TestServerVersion(t *testing.T) {
	t.Parallel()
	c, prefix := testenv.Redis(t)
	var logs testkit.Logs
	s := newSink(t, c, redisstream.Config{Stream: "v", KeyPrefix: prefix}, &logs)
	for i := range 3 {
		wantOutcomes(t, s.Send(context.Background(), batch(event(int64(i+1), "deal", "1"))), dispatch.Delivered)
	}
	info, err := c.Info(context.Background(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	var version string
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			version = v
		}
	}
	line := logs.WaitLine(t, 5*time.Second, `"redis_version":"`+version+`"`)
	if !strings.Contains(line, "IDMP") {
		t.Errorf("version line does not say whether IDMP is available: %s", line)
	}
	if n := logs.Count(`"redis_version"`); n != 1 {
		t.Errorf("%d version lines, want 1", n)
	}
}

// BenchmarkSend10k: 10,000 events in Sends of 500 to one local stream;
// reports events/s.
func BenchmarkSend10k(b *testing.B) {
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(), ContextTimeoutEnabled: true})
	defer c.Close()
	key := "bench:" + strconv.FormatInt(time.Now().UnixNano(), 36)
	defer c.Del(context.Background(), key)
	s, err := redisstream.New(redisstream.Config{Client: c, Stream: key, MaxLen: redisstream.DefaultMaxLen})
	if err != nil {
		b.Fatal(err)
	}
	var batches [][]dispatch.Event
	for from := 0; from < 10000; from += 500 {
		var events []dispatch.Event
		for i := from; i < from+500; i++ {
			ev := event(int64(i+1), "deal", strconv.Itoa(i%50))
			ev.Payload = json.RawMessage(`{"amount":1250,"currency":"EUR","customer":"c-123456","note":"a typical small event body"}`)
			ev.Headers = json.RawMessage(`{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}`)
			events = append(events, ev)
		}
		batches = append(batches, events)
	}
	start, n := time.Now(), 0
	for b.Loop() {
		n++
		for _, events := range batches {
			for _, r := range s.Send(context.Background(), batch(events...)) {
				if r.Outcome != dispatch.Delivered {
					b.Fatalf("%s: %v", r.Outcome, r.Err)
				}
			}
		}
	}
	b.ReportMetric(float64(10000*n)/time.Since(start).Seconds(), "events/s")
}
