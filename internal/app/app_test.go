package app_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/internal/app"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/store"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// receiver records deliveries and checks each request against the contract.
type receiver struct {
	t      *testing.T
	secret []byte
	mu     sync.Mutex
	got    []delivery
	unique map[int64]bool
	all    chan struct{}
	want   int
}

type delivery struct {
	ID    int64
	Agg   string
	Token int64
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var ev dispatch.Event
	if err := json.Unmarshal(body, &ev); err != nil {
		rc.t.Errorf("body is not the contract's JSON: %v: %s", err, body)
		w.WriteHeader(400)
		return
	}
	id := strconv.FormatInt(ev.ID, 10)
	h := r.Header
	if h.Get("Content-Type") != "application/json" || h.Get("Idempotency-Key") != id || h.Get("webhook-id") != id {
		rc.t.Errorf("event %d: headers %v", ev.ID, h)
	}
	ts, _ := strconv.ParseInt(h.Get("webhook-timestamp"), 10, 64)
	if want := dispatch.Sign(rc.secret, id, ts, body); h.Get("webhook-signature") != want {
		rc.t.Errorf("event %d: signature %q, want %q", ev.ID, h.Get("webhook-signature"), want)
	}
	token, err := strconv.ParseInt(h.Get("X-Fencing-Token"), 10, 64)
	if err != nil || token < 1 {
		rc.t.Errorf("event %d: X-Fencing-Token %q", ev.ID, h.Get("X-Fencing-Token"))
	}
	if ev.AggregateType == "" || ev.EventType == "" || ev.CreatedAt.IsZero() || len(ev.Payload) == 0 {
		rc.t.Errorf("event %d: incomplete body %s", ev.ID, body)
	}
	rc.mu.Lock()
	rc.got = append(rc.got, delivery{ev.ID, ev.AggregateType + "/" + ev.AggregateID, token})
	rc.unique[ev.ID] = true
	if len(rc.unique) == rc.want {
		close(rc.all)
	}
	rc.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// syncBuffer collects log lines from the daemon's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestEndToEndRelaysEveryEventInAggregateOrder(t *testing.T) {
	const events, aggregates = 1000, 50
	st, dsn := testenv.Store(t)
	rdb, prefix := testenv.Redis(t)
	ctx := context.Background()

	rc := &receiver{t: t, secret: []byte("e2e-secret"), unique: map[int64]bool{}, all: make(chan struct{}), want: events}
	srv := httptest.NewServer(rc)
	defer srv.Close()

	logs := &syncBuffer{}
	a := newApp(t, logs, "debug",
		"postgres.dsn="+dsn,
		"redis.addrs="+testenv.RedisAddr(),
		"redis.key_prefix="+prefix,
		"dispatch.webhook.url="+srv.URL+"/events",
		"dispatch.webhook.secret=e2e-secret",
		"http.addr=127.0.0.1:0",
		"poller.poll_interval=20ms",
		"poller.batch_size=100",
		"poller.concurrency=8",
	)

	insert := func(from, to int) {
		err := pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error {
			var evs []store.Event
			for i := from; i < to; i++ {
				evs = append(evs, store.Event{
					AggregateType: "deal", AggregateID: strconv.Itoa(i % aggregates), EventType: "deal.funded",
					Payload: json.RawMessage(fmt.Sprintf(`{"seq":%d}`, i)),
				})
			}
			return store.Enqueue(ctx, tx, evs...)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// Half before the daemon starts (a backlog), half while it runs.
	for i := 0; i < events/2; i += 100 {
		insert(i, i+100)
	}
	stop := runApp(t, a)
	for i := events / 2; i < events; i += 100 {
		insert(i, i+100)
	}

	select {
	case <-rc.all:
	case <-time.After(60 * time.Second):
		rc.mu.Lock()
		n := len(rc.unique)
		rc.mu.Unlock()
		t.Fatalf("only %d of %d events delivered", n, events)
	}

	// While running: the lock key holds a UUID with a TTL of at most 30 s.
	lockKey := prefix + "lock:outbox:poller"
	owner := rdb.Get(ctx, lockKey).Val()
	if _, err := uuid.Parse(owner); err != nil {
		t.Fatalf("lock key holds %q, want a UUID", owner)
	}
	if ttl := rdb.PTTL(ctx, lockKey).Val(); ttl <= 0 || ttl > 30*time.Second {
		t.Fatalf("lock TTL %s, want (0, 30s]", ttl)
	}

	// dispatched_at is set on all rows (the mark follows the send closely).
	waitAllMarked(t, st)

	stop()
	if n := rdb.Exists(ctx, lockKey).Val(); n != 0 {
		t.Fatal("lock not released on shutdown")
	}

	// First deliveries in id order per aggregate.
	rc.mu.Lock()
	defer rc.mu.Unlock()
	seen, last := map[int64]bool{}, map[string]int64{}
	for _, d := range rc.got {
		if seen[d.ID] {
			continue
		}
		seen[d.ID] = true
		if d.ID < last[d.Agg] {
			t.Fatalf("aggregate %s: event %d delivered after %d", d.Agg, d.ID, last[d.Agg])
		}
		last[d.Agg] = d.ID
	}
	if len(last) != aggregates {
		t.Fatalf("%d aggregates delivered, want %d", len(last), aggregates)
	}

	// Every idempotency key says delivered, for about 24 h.
	rows, _ := st.Pool().Query(ctx, `SELECT id FROM outbox ORDER BY id`)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil || len(ids) != events {
		t.Fatalf("%d rows, err %v", len(ids), err)
	}
	pipe := rdb.Pipeline()
	vals := make([]func() (string, time.Duration), len(ids))
	for i, id := range ids {
		k := prefix + "idempotency:notify:" + strconv.FormatInt(id, 10)
		g, p := pipe.Get(ctx, k), pipe.PTTL(ctx, k)
		vals[i] = func() (string, time.Duration) { return g.Val(), p.Val() }
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	for i, v := range vals {
		val, ttl := v()
		if val != "1" || ttl < 23*time.Hour || ttl > 24*time.Hour {
			t.Fatalf("idempotency key of %d: %q with TTL %s, want \"1\" with ~24h", ids[i], val, ttl)
		}
	}

	// Every log line is JSON with time, level, msg; lock lines carry the lock and token.
	sc := bufio.NewScanner(bytes.NewReader([]byte(logs.String())))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var sawAcquired, sawReleased bool
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("log line is not JSON: %s", sc.Text())
		}
		for _, k := range []string{"time", "level", "msg"} {
			if _, ok := m[k]; !ok {
				t.Fatalf("log line without %s: %s", k, sc.Text())
			}
		}
		switch m["msg"] {
		case "lock acquired":
			sawAcquired = m["lock"] == "lock:outbox:poller" && m["fencing_token"] != nil
		case "lock released":
			sawReleased = m["lock"] == "lock:outbox:poller"
		}
		if bytes.Contains(sc.Bytes(), []byte("e2e-secret")) {
			t.Fatalf("log line shows the webhook secret: %s", sc.Text())
		}
	}
	if !sawAcquired || !sawReleased {
		t.Fatalf("lock transitions not logged (acquired %t, released %t)", sawAcquired, sawReleased)
	}
}

// The poller and the reconciler run together (retention 1 s, every second)
// while events flow: neither undoes the other's writes and nothing pending
// is ever deleted.
func TestPollerAndReconcilerNeverUndoEachOther(t *testing.T) {
	st, dsn := testenv.Store(t)
	_, prefix := testenv.Redis(t)
	ctx := context.Background()
	for _, sql := range []string{
		`CREATE TABLE audit (id bigint, what text)`,
		`CREATE FUNCTION audit_outbox() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
		   IF TG_OP = 'DELETE' AND OLD.dispatched_at IS NULL THEN INSERT INTO audit VALUES (OLD.id, 'deleted pending'); END IF;
		   IF TG_OP = 'UPDATE' AND OLD.dispatched_at IS NOT NULL THEN INSERT INTO audit VALUES (OLD.id, 'rewrote delivered'); END IF;
		   RETURN NULL; END $$`,
		`CREATE TRIGGER audit_outbox AFTER UPDATE OR DELETE ON outbox FOR EACH ROW EXECUTE FUNCTION audit_outbox()`,
	} {
		if _, err := st.Pool().Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	const events = 600
	rc := &receiver{t: t, secret: []byte("s"), unique: map[int64]bool{}, all: make(chan struct{}), want: events}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	stop := runApp(t, newApp(t, io.Discard, "warn",
		"postgres.dsn="+dsn, "redis.addrs="+testenv.RedisAddr(), "redis.key_prefix="+prefix,
		"dispatch.webhook.url="+srv.URL, "dispatch.webhook.secret=s", "http.addr=127.0.0.1:0",
		"poller.poll_interval=10ms", "poller.batch_size=20",
		"reconcile.schedule=@every 1s", "reconcile.retention=1s", "reconcile.batch_size=7",
	))
	for i := range events / 20 {
		err := pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error {
			var evs []store.Event
			for j := range 20 {
				evs = append(evs, store.Event{AggregateType: "deal", AggregateID: strconv.Itoa(j % 9),
					EventType: "deal.funded", Payload: json.RawMessage(`{}`)})
			}
			return store.Enqueue(ctx, tx, evs...)
		})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(10+i%3*20) * time.Millisecond)
	}
	select {
	case <-rc.all:
	case <-time.After(60 * time.Second):
		t.Fatal("not every event delivered")
	}
	// Let at least two more reconciliations purge what was delivered.
	deadline := time.Now().Add(15 * time.Second)
	for {
		var left int
		_ = st.Pool().QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&left)
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rows never purged", left)
		}
		time.Sleep(100 * time.Millisecond)
	}
	stop()
	var violations int
	_ = st.Pool().QueryRow(ctx, `SELECT count(*) FROM audit`).Scan(&violations)
	if violations != 0 {
		t.Fatalf("%d writes undid another's (deleted pending or rewrote delivered rows)", violations)
	}
	var runs int
	_ = st.Pool().QueryRow(ctx, `SELECT count(*) FROM reconcile_runs WHERE finished_at IS NOT NULL`).Scan(&runs)
	if runs < 2 {
		t.Fatalf("%d reconciliations ran", runs)
	}
}

// waitAllMarked waits until every outbox row has dispatched_at: a batch's
// results are written after its last send.
func waitAllMarked(t *testing.T, st *store.Store) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var left int
		if err := st.Pool().QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE dispatched_at IS NULL`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rows still without dispatched_at", left)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// newApp loads config from sets (on top of the defaults) and builds an App
// logging JSON at level to w; closed at cleanup.
func newApp(t *testing.T, w io.Writer, level string, sets ...string) *app.App {
	t.Helper()
	cfg, err := app.LoadConfig("", sets)
	if err != nil {
		t.Fatal(err)
	}
	a, err := app.New(context.Background(), cfg, app.NewLogger(level, "json", w))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	return a
}

// runApp runs a until the returned stop, which requires a clean exit.
func runApp(t *testing.T, a *app.App) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	return func() {
		t.Helper()
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
}
