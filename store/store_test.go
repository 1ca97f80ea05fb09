package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/migrations"
	"github.com/outboxd/outboxd/store"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// done names rows by id for Complete, with their created_at as stored.
func done(t *testing.T, st *store.Store, ids ...int64) []store.Delivered {
	t.Helper()
	out := make([]store.Delivered, len(ids))
	for i, id := range ids {
		out[i].ID = id
		if err := st.Pool().QueryRow(context.Background(), `SELECT created_at FROM outbox WHERE id = $1`, id).Scan(&out[i].CreatedAt); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func enqueue(t *testing.T, st *store.Store, events ...store.Event) {
	t.Helper()
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error { return store.Enqueue(ctx, tx, events...) })
	if err != nil {
		t.Fatal(err)
	}
}

func ev(agg, id string, n int) store.Event {
	return store.Event{AggregateType: agg, AggregateID: id, EventType: agg + ".happened",
		Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, n))}
}

type rowState struct {
	dispatched, dead bool
	attempts         int
	lastError        *string
}

func state(t *testing.T, st *store.Store, id int64) rowState {
	t.Helper()
	var s rowState
	err := st.Pool().QueryRow(context.Background(),
		`SELECT dispatched_at IS NOT NULL, dead_at IS NOT NULL, attempts, last_error FROM outbox WHERE id = $1`, id).
		Scan(&s.dispatched, &s.dead, &s.attempts, &s.lastError)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestEnqueueCommitsWithTheCallersTransaction(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	enqueue(t, st, ev("deal", "1", 1), store.Event{
		AggregateType: "deal", AggregateID: "1", EventType: "deal.funded",
		Payload: json.RawMessage(`{"amount":10}`), Headers: map[string]string{"traceparent": "00-abc-def-01"},
	})
	// A rolled-back transaction leaves nothing behind.
	tx, err := st.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Enqueue(ctx, tx, ev("deal", "2", 3)); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback(ctx)

	rows, err := st.ReadPath().FetchDue(ctx, store.FetchLimits{Rows: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0].ID >= rows[1].ID {
		t.Fatalf("got %d rows %+v, want the 2 committed in id order", len(rows), rows)
	}
	var h map[string]string
	if err := json.Unmarshal(rows[1].Headers, &h); err != nil || h["traceparent"] != "00-abc-def-01" {
		t.Fatalf("headers %s, want the traceparent passed through", rows[1].Headers)
	}
}

func TestEnqueueNamesTheBadField(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	for _, tc := range []struct {
		ev   store.Event
		want string
	}{
		{store.Event{AggregateID: "1", EventType: "x", Payload: json.RawMessage(`{}`)}, "aggregate_type"},
		{store.Event{AggregateType: "a", EventType: "x", Payload: json.RawMessage(`{}`)}, "aggregate_id"},
		{store.Event{AggregateType: "a", AggregateID: "1", Payload: json.RawMessage(`{}`)}, "event_type"},
		{store.Event{AggregateType: "a", AggregateID: "1", EventType: "x", Payload: json.RawMessage(`{nope`)}, "payload"},
	} {
		err := pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error { return store.Enqueue(ctx, tx, tc.ev) })
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("event %+v: error %v, want one naming %s", tc.ev, err, tc.want)
		}
	}
}

func TestStaleFenceIsRejectedAndChangesNothing(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	enqueue(t, st, ev("deal", "1", 1), ev("deal", "2", 2))
	rows, _ := st.ReadPath().FetchDue(ctx, store.FetchLimits{Rows: 10})
	a, b := rows[0].ID, rows[1].ID

	newer := store.Fence{Lock: "lock:outbox:poller", Token: 7, Owner: "owner-7"}
	older := store.Fence{Lock: "lock:outbox:poller", Token: 6, Owner: "owner-6"}
	if err := st.ClaimFence(ctx, newer); err != nil {
		t.Fatal(err)
	}
	// The same token from another holder (a lost counter handed it out twice).
	twin := store.Fence{Lock: newer.Lock, Token: 7, Owner: "other-owner"}
	if _, _, err := counts(st.ReadPath().Complete(ctx, twin, store.Outcomes{Delivered: done(t, st, a)})); !errors.Is(err, store.ErrStaleFence) {
		t.Fatalf("equal token, other owner: %v, want ErrStaleFence", err)
	}

	_, _, err := counts(st.ReadPath().Complete(ctx, older, store.Outcomes{Delivered: done(t, st, a), Failures: []store.Failure{{ID: b, Error: "boom", Dead: true}}}))
	if !errors.Is(err, store.ErrStaleFence) {
		t.Fatalf("write with token 6 after 7: %v, want ErrStaleFence", err)
	}
	if s := state(t, st, a); s.dispatched {
		t.Fatal("stale writer marked a row delivered")
	}
	if s := state(t, st, b); s.dead || s.attempts != 0 || s.lastError != nil {
		t.Fatalf("stale writer changed a row: %+v", s)
	}
	if tok, _ := st.FenceToken(ctx, newer.Lock); tok != 7 {
		t.Fatalf("fence token %d, want 7", tok)
	}
	if err := st.ClaimFence(ctx, older); !errors.Is(err, store.ErrStaleFence) {
		t.Fatalf("claiming an older token: %v", err)
	}

	// The current holder (and a newer one) may write; the fence only rises.
	nd, nf, err := counts(st.ReadPath().Complete(ctx, newer, store.Outcomes{Delivered: done(t, st, a), Failures: []store.Failure{{ID: b, Error: "boom", Delay: time.Hour}}}))
	if err != nil || nd != 1 || nf != 1 {
		t.Fatalf("current holder: delivered %d failed %d err %v", nd, nf, err)
	}
	if s := state(t, st, b); s.attempts != 1 || s.lastError == nil || *s.lastError != "boom" {
		t.Fatalf("failure not recorded: %+v", s)
	}
	if err := st.ClaimFence(ctx, store.Fence{Lock: newer.Lock, Token: 9, Owner: "owner-9"}); err != nil {
		t.Fatal(err)
	}
	if tok, _ := st.FenceToken(ctx, newer.Lock); tok != 9 {
		t.Fatalf("fence token %d, want 9", tok)
	}
	// Fences of different locks are independent.
	if err := st.ClaimFence(ctx, store.Fence{Lock: "lock:reconciliation", Token: 1}); err != nil {
		t.Fatalf("other lock: %v", err)
	}
}

func TestFetchDueKeepsAggregateOrderBehindBackoff(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	enqueue(t, st, ev("deal", "A", 1), ev("deal", "A", 2), ev("deal", "B", 3), ev("deal", "A", 4))
	rows, _ := st.ReadPath().FetchDue(ctx, store.FetchLimits{Rows: 10})
	if len(rows) != 4 {
		t.Fatalf("got %d rows, want 4", len(rows))
	}
	first := rows[0].ID
	f := store.Fence{Lock: "lock:outbox:poller", Token: 1}
	// A's first row backs off: A's later rows must wait; B flows.
	if _, _, err := counts(st.ReadPath().Complete(ctx, f, store.Outcomes{Failures: []store.Failure{{ID: first, Error: "503", Delay: time.Hour}}})); err != nil {
		t.Fatal(err)
	}
	rows, _ = st.ReadPath().FetchDue(ctx, store.FetchLimits{Rows: 10})
	if len(rows) != 1 || rows[0].AggregateID != "B" {
		t.Fatalf("due rows %+v, want only B's", rows)
	}
	// A dead row does not block its aggregate.
	if _, _, err := counts(st.ReadPath().Complete(ctx, f, store.Outcomes{Failures: []store.Failure{{ID: first, Error: "400", Dead: true}}})); err != nil {
		t.Fatal(err)
	}
	rows, _ = st.ReadPath().FetchDue(ctx, store.FetchLimits{Rows: 10})
	if len(rows) != 3 || rows[0].AggregateID != "A" {
		t.Fatalf("due rows after dead-letter: %+v, want A's two later rows and B's", rows)
	}
}

func TestNotifyTriggerSwitch(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	has := func() bool {
		var ok bool
		if err := st.Pool().QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'outbox_notify')`).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if has() {
		t.Fatal("trigger present before being switched on")
	}
	woke := make(chan struct{}, 1)
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	if err := st.SetNotifyTrigger(ctx, true); err != nil || !has() {
		t.Fatalf("on: %v", err)
	}
	go func() { done <- st.ReadPath().Listen(lctx, "outbox_events", func() { woke <- struct{}{} }) }()
	// Listen is asynchronous: insert until the notification arrives.
	deadline := time.After(5 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
wait:
	for {
		select {
		case <-woke:
			break wait
		case <-tick.C:
			enqueue(t, st, ev("deal", "n", 1))
		case <-deadline:
			t.Fatal("no notification after inserts with the trigger on")
		}
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Listen ended with %v, want the cancellation", err)
	}
	if err := st.SetNotifyTrigger(ctx, false); err != nil || has() {
		t.Fatalf("off: %v", err)
	}
}

func TestMissingSchemaSaysRunMigrate(t *testing.T) {
	t.Parallel()
	st, err := store.Open(context.Background(), testenv.EmptyDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	_, err1 := st.FenceToken(ctx, "lock:outbox:poller")
	_, err2 := st.Ops().Stats(ctx)
	_, err3 := st.ReadPath().FetchDue(ctx, store.FetchLimits{Rows: 10})
	for _, err := range []error{err1, err2, err3} {
		if !errors.Is(err, store.ErrNotMigrated) || !strings.Contains(err.Error(), "outboxd migrate") {
			t.Fatalf("got %v, want ErrNotMigrated telling to run `outboxd migrate`", err)
		}
	}
}

// Skip leaves the given rows out, and only them; the limit counts the rows returned.
func TestFetchDueLeavesSkippedRowsOut(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	enqueue(t, st, ev("deal", "A", 1), ev("deal", "A", 2), ev("deal", "B", 3), ev("deal", "C", 4))
	all, err := st.ReadPath().FetchDue(ctx, store.FetchLimits{Rows: 10})
	if err != nil || len(all) != 4 {
		t.Fatalf("%d rows, %v", len(all), err)
	}
	rows, err := st.ReadPath().FetchDue(ctx, store.FetchLimits{Rows: 2, Skip: []int64{all[0].ID, all[2].ID}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0].ID != all[1].ID || rows[1].ID != all[3].ID {
		t.Fatalf("rows %+v, want ids %d and %d", rows, all[1].ID, all[3].ID)
	}
}

// Busy leaves out every row of the named aggregates, and only those: the
// same aggregate id under another type, or another id, still comes back.
func TestFetchDueLeavesBusyAggregatesOut(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	enqueue(t, st, ev("deal", "A", 1), ev("deal", "B", 2), ev("deal", "A", 3), ev("user", "A", 4), ev("deal", "C", 5))
	all, err := st.ReadPath().FetchDue(ctx, store.FetchLimits{Rows: 10})
	if err != nil || len(all) != 5 {
		t.Fatalf("%d rows, %v", len(all), err)
	}
	rows, err := st.ReadPath().FetchDue(ctx, store.FetchLimits{Rows: 10,
		Busy: []store.Aggregate{{Type: "deal", ID: "A"}, {Type: "deal", ID: "C"}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0].ID != all[1].ID || rows[1].ID != all[3].ID {
		t.Fatalf("rows %+v, want ids %d (deal/B) and %d (user/A)", rows, all[1].ID, all[3].ID)
	}
}

// Complete's asynchronous commit is its own: the connection it ran on
// commits synchronously again afterwards.
func TestCompleteLeavesSynchronousCommitOn(t *testing.T) {
	t.Parallel()
	_, dsn := testenv.Store(t)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1 // Complete and the check share the connection
	st, err := store.OpenConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	enqueue(t, st, ev("deal", "A", 1))
	rows, _ := st.ReadPath().FetchDue(ctx, store.FetchLimits{Rows: 1})
	if n, _, err := counts(st.ReadPath().Complete(ctx, store.Fence{Lock: "lock:outbox:poller", Token: 1}, store.Outcomes{Delivered: done(t, st, rows[0].ID)})); err != nil || n != 1 {
		t.Fatalf("complete: %d, %v", n, err)
	}
	var v string
	if err := st.Pool().QueryRow(ctx, `SHOW synchronous_commit`).Scan(&v); err != nil || v != "on" {
		t.Fatalf("synchronous_commit after Complete: %q, %v", v, err)
	}
}

// A raised fence survives a crash even where the server or the connection
// commits asynchronously by default: ClaimFence commits synchronously.
func TestClaimFenceIsDurableWhateverTheDefault(t *testing.T) {
	t.Parallel()
	pg := testenv.StartPostgresServer(t)
	ctx := context.Background()
	if _, err := migrations.Up(ctx, pg.DSN, nil); err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.Connect(ctx, pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	// Asynchronous commits are written out every wal_writer_delay: longer
	// than the test, so the crash finds one unwritten.
	_, err = admin.Exec(ctx, `ALTER SYSTEM SET wal_writer_delay = '10s'`)
	_ = admin.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pg.CrashRestart()
	cfg, err := pgxpool.ParseConfig(pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	st, err := store.OpenConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.ClaimFence(ctx, store.Fence{Lock: "lock:outbox:poller", Token: 7, Owner: "a"}); err != nil {
		t.Fatal(err)
	}
	pg.CrashRestart()
	st.Pool().Reset()
	if tok, err := st.FenceToken(ctx, "lock:outbox:poller"); err != nil || tok != 7 {
		t.Fatalf("fence after a crash: %d, %v; want 7", tok, err)
	}
}
