package store_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/store"
)

func exec(t *testing.T, st *store.Store, sql string, args ...any) {
	t.Helper()
	if _, err := st.Pool().Exec(context.Background(), sql, args...); err != nil {
		t.Fatal(err)
	}
}

// A batch is bounded in bytes: it is a prefix of the due rows (no aggregate
// gets a gap), and the first row always comes.
func TestFetchDueStaysWithinTheByteBudget(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	// 10 rows of ~10 kB (incompressible), then small ones.
	exec(t, st, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'deal', (g % 3)::text, 'e', jsonb_build_object('blob',
		  (SELECT string_agg(md5(g::text || ':' || i::text), '') FROM generate_series(1, 300) i))
		FROM generate_series(1, 10) g`)
	enqueue(t, st, ev("deal", "0", 1), ev("deal", "1", 2))

	rows, err := st.ReadPath().FetchDue(ctx, store.FetchLimits{Rows: 100, RowBytes: 1 << 20, Bytes: 35_000})
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, r := range rows {
		total += r.Size
		if r.Size < 9_000 || r.Poison != "" || len(r.Payload) < 9_000 {
			t.Fatalf("row %d: size %d poison %q payload %d bytes", r.ID, r.Size, r.Poison, len(r.Payload))
		}
	}
	if len(rows) != 3 || total > 35_000 || rows[0].ID >= rows[1].ID || rows[1].ID >= rows[2].ID {
		t.Fatalf("got %d rows, %d bytes; want the first 3, in id order, within 35000 bytes", len(rows), total)
	}
	// A budget below one row still returns that row.
	rows, _ = st.ReadPath().FetchDue(ctx, store.FetchLimits{Rows: 100, RowBytes: 1 << 20, Bytes: 1})
	if len(rows) != 1 {
		t.Fatalf("tiny budget: %d rows, want the first row alone", len(rows))
	}
	rows, _ = st.ReadPath().FetchDue(ctx, store.FetchLimits{Rows: 100})
	if len(rows) != 12 {
		t.Fatalf("no byte limits: %d rows, want all 12", len(rows))
	}
}

// A row above RowBytes comes back without its payload and headers, marked
// poison with a reason naming the limit, even when Postgres stores it
// compressed to almost nothing; it does not count against the budget.
func TestOversizedRowsAreNotLoaded(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	exec(t, st, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers) VALUES
		('deal', '1', 'big', jsonb_build_object('blob', repeat('x', 10*1024*1024)), '{}'),
		('deal', '2', 'big', jsonb_build_object('blob',
		   (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 70000) i)), '{}'),
		('deal', '3', 'big', '{}', jsonb_build_object('h', repeat('y', 3*1024*1024)))`)
	enqueue(t, st, ev("deal", "1", 1))
	var stored int64
	if err := st.Pool().QueryRow(ctx, `SELECT pg_column_size(payload) FROM outbox ORDER BY id LIMIT 1`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	rows, err := st.ReadPath().FetchDue(ctx, store.FetchLimits{Rows: 10, RowBytes: 1 << 20, Bytes: 2 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 4 {
		t.Fatalf("got %d rows, want all 4 (oversized rows cost no budget)", len(rows))
	}
	for _, r := range rows[:3] {
		if r.Poison == "" || !strings.Contains(r.Poison, "poller.max_payload_bytes") || r.Payload != nil || r.Headers != nil ||
			r.Size <= 1<<20 || len(r.AggregateID) > 200 {
			t.Fatalf("row %d (size %d): poison %q, payload %d bytes, headers %d bytes, aggregate_id %d bytes; want it marked and not loaded",
				r.ID, r.Size, r.Poison, len(r.Payload), len(r.Headers), len(r.AggregateID))
		}
	}
	if rows[0].Size < 10*1024*1024 {
		t.Fatalf("compressed row measured %d bytes (stored %d), want its text size", rows[0].Size, stored)
	}
	if last := rows[3]; last.Poison != "" || string(last.Payload) != `{"n": 1}` {
		t.Fatalf("normal row: poison %q payload %s", last.Poison, last.Payload)
	}
}

// A created_at of infinity (a producer's odd row) does not break the fetch:
// that row is marked poison, the others come back.
func TestInfiniteCreatedAtIsPoisonNotAFailedFetch(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	exec(t, st, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at, available_at)
		VALUES ('deal', '1', 'e', '{}', 'infinity', '-infinity'), ('deal', '2', 'e', '{}', '-infinity', '-infinity')`)
	enqueue(t, st, ev("deal", "3", 1))
	rows, err := st.ReadPath().FetchDue(context.Background(), store.FetchLimits{Rows: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3 || rows[0].Poison == "" || rows[1].Poison == "" || rows[2].Poison != "" {
		t.Fatalf("rows %+v: want the two infinite ones poison, the third clean", rows)
	}
}

// Whatever text a receiver answered, last_error is stored valid UTF-8,
// without NUL, at most MaxErrorBytes, cut on a character boundary.
func TestCompleteStoresAnyText(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	var evs []store.Event
	for i := range 4 {
		evs = append(evs, ev("deal", fmt.Sprint(i), i))
	}
	enqueue(t, st, evs...)
	rows, _ := st.ReadPath().FetchDue(ctx, store.FetchLimits{Rows: 10})
	texts := []string{"500 Bad \xe9 thing", "500 Bad \x00 thing", "500 " + strings.Repeat("é", 3000)}
	var failures []store.Failure
	for i, s := range texts {
		failures = append(failures, store.Failure{ID: rows[i].ID, Error: s, Delay: time.Hour})
	}
	f := store.Fence{Lock: "lock:outbox:poller", Token: 1, Owner: "o"}
	nd, nf, err := counts(st.ReadPath().Complete(ctx, f, store.Outcomes{Delivered: done(t, st, rows[3].ID), Failures: failures}))
	if err != nil || nd != 1 || nf != 3 {
		t.Fatalf("delivered %d failed %d err %v, want 1 and 3", nd, nf, err)
	}
	for i := range texts {
		s := state(t, st, rows[i].ID)
		if s.attempts != 1 || s.lastError == nil {
			t.Fatalf("row %d: %+v", i, s)
		}
		e := *s.lastError
		if !utf8.ValidString(e) || strings.ContainsRune(e, 0) || len(e) > store.MaxErrorBytes || !strings.HasPrefix(e, "500 ") {
			t.Errorf("row %d: last_error %.60q (%d bytes) is not clean", i, e, len(e))
		}
	}
}

// One value Postgres refuses (here a last_error an operator's trigger
// refuses with a data exception) does not hold back the batch: the
// deliveries and the other failures are written, and the refused one is
// stored saying so, with its attempt counted.
func TestCompleteFallsBackWhenOneValueIsRefused(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	enqueue(t, st, ev("deal", "1", 1), ev("deal", "2", 2), ev("deal", "3", 3))
	rows, _ := st.ReadPath().FetchDue(ctx, store.FetchLimits{Rows: 10})
	f := store.Fence{Lock: "lock:outbox:poller", Token: 1, Owner: "o"}
	for _, sql := range []string{
		`CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
		   IF NEW.last_error = 'refused 503' THEN RAISE EXCEPTION 'refused' USING ERRCODE = '22023'; END IF;
		   RETURN NEW; END $$`,
		`CREATE TRIGGER refuse BEFORE UPDATE ON outbox FOR EACH ROW EXECUTE FUNCTION refuse()`,
	} {
		if _, err := st.Pool().Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	nd, nf, err := counts(st.ReadPath().Complete(ctx, f, store.Outcomes{Delivered: done(t, st, rows[0].ID), Failures: []store.Failure{
		{ID: rows[1].ID, Error: "refused 503", Delay: time.Hour},
		{ID: rows[2].ID, Error: "503", Delay: time.Hour},
	}}))
	if err != nil || nd != 1 || nf != 2 {
		t.Fatalf("delivered %d failed %d err %v, want 1 and 2", nd, nf, err)
	}
	if !state(t, st, rows[0].ID).dispatched {
		t.Fatal("the delivery was held back")
	}
	if s := state(t, st, rows[2].ID); s.attempts != 1 || *s.lastError != "503" {
		t.Fatalf("the other failure: %+v", s)
	}
	s := state(t, st, rows[1].ID)
	if s.attempts != 1 || s.lastError == nil || !strings.Contains(*s.lastError, "could not store") || !strings.Contains(*s.lastError, "503") {
		t.Fatalf("the refused failure: attempts %d last_error %v", s.attempts, s.lastError)
	}
	// A stale writer is still refused, also on the fallback path.
	stale := store.Fence{Lock: f.Lock, Token: 0}
	if _, _, err := counts(st.ReadPath().Complete(ctx, stale, store.Outcomes{Failures: []store.Failure{{ID: rows[2].ID, Error: "refused 503"}}})); err == nil {
		t.Fatal("a write without a token passed")
	}
}
