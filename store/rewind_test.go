package store_test

import (
	"context"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/store"
)

// The read's checks for reused ids (store/rewind.go: the server's
// incarnation and the id sequence's last value) cost one shared buffer per
// read, the sequence's page: the read without them, side by side, touches
// one fewer, idle and with 100 rows pending. The sequence is looked up once
// per read (id_seq in cursor.sql); inlined into each use it costs several buffers more.
func TestRewindChecksCostOneBuffer(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	lim := store.FetchLimits{Rows: 100, RowBytes: 1 << 20, Bytes: 16 << 20}
	without := store.ReadSQL
	i := strings.Index(without, ",\n    "+store.IncarnationSQL)
	j := strings.Index(without, " AS seqlast")
	if i < 0 || j < i {
		t.Fatal("the read's snap row changed: adapt the test")
	}
	without = without[:i] + without[j+len(" AS seqlast"):]
	without = strings.Replace(without, "snap.incarnation", "NULL", 1)
	q := strings.Index(without, "UNION ALL\nSELECT 'q'")
	k := strings.Index(without, "snap.seqlast IS NOT NULL\n")
	if q < 0 || k < q {
		t.Fatal("the read's q row changed: adapt the test")
	}
	without = without[:q] + without[k+len("snap.seqlast IS NOT NULL\n"):]
	if strings.Contains(without, "seqlast") || strings.Contains(without, "snap.incarnation") || strings.Contains(without, "postmaster") {
		t.Fatalf("the checks were not all taken out:\n%s", without)
	}
	compare := func(what string) {
		c := maxID(t, st)
		args, _ := store.ReadArgs(lim, store.ReadPos{Cursor: max(c-100, 0), Frontier: max(c-100, 0)})
		buffers(t, st, without, args...) // warm the caches of both
		buffers(t, st, store.ReadSQL, args...)
		b0, b1 := buffers(t, st, without, args...), buffers(t, st, store.ReadSQL, args...)
		t.Logf("%s: %d shared buffers without the checks, %d with", what, b0, b1)
		if b1 > b0+1 {
			t.Errorf("%s: the checks cost %d buffers per read (%d → %d), want at most 1", what, b1-b0, b0, b1)
		}
	}
	compare("idle")
	var evs []store.Event
	for i := range 100 {
		evs = append(evs, ev("deal", string(rune('a'+i%10)), i))
	}
	enqueue(t, st, evs...)
	compare("100 pending")
}

// The incarnation names the server, not the session: a connection with
// other TimeZone and DateStyle settings reads the same name (the pool's
// connections may differ, e.g. after ALTER ROLE ... SET timezone).
func TestIncarnationIgnoresSessionSettings(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	name := func(settings string) string {
		conn, err := st.Pool().Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
		if _, err := conn.Exec(ctx, settings); err != nil {
			t.Fatal(err)
		}
		var s string
		if err := conn.QueryRow(ctx, `SELECT `+store.IncarnationSQL).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	a := name(`SET TimeZone = 'UTC'; SET DateStyle = 'ISO, MDY'`)
	b := name(`SET TimeZone = 'Asia/Kathmandu'; SET DateStyle = 'SQL, DMY'`)
	if a != b {
		t.Errorf("one server, two names: %q and %q", a, b)
	}
}

// idTakenSince commits a row, reads it (as Delivered), then gives its id
// to another row, and returns the store, a claimed fence, the id and the
// row as read.
func idTakenSince(t *testing.T) (*store.Store, store.Fence, int64, []store.Delivered) {
	t.Helper()
	st, _ := testenv.Store(t)
	enqueue(t, st, ev("deal", "1", 1))
	id := maxID(t, st)
	read := done(t, st, id)
	exec(t, st, `DELETE FROM outbox WHERE id = $1`, id)
	exec(t, st, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, created_at)
		OVERRIDING SYSTEM VALUE VALUES ($1, 'deal', '2', 'deal.funded', '{}', now() + interval '1 second')`, id)
	f := store.Fence{Lock: "lock:outbox:poller", Token: 1, Owner: "o"}
	if err := st.ClaimFence(context.Background(), f); err != nil {
		t.Fatal(err)
	}
	return st, f, id, read
}

// Complete marks a row delivered only if it is still the row that was
// read: a row that took its id since (ids handed out again: a failover to
// a replica that lagged, a restore, setval) stays pending, to be sent.
func TestCompleteLeavesARowThatTookTheIdSince(t *testing.T) {
	t.Parallel()
	st, f, id, read := idTakenSince(t)
	ctx := context.Background()
	if n, _, err := counts(st.ReadPath().Complete(ctx, f, store.Outcomes{Delivered: read})); err != nil || n != 0 {
		t.Fatalf("Complete of the row read: %d marked, %v; want 0: the row with its id now is another", n, err)
	}
	if n, _, err := counts(st.ReadPath().Complete(ctx, f, store.Outcomes{Delivered: done(t, st, id)})); err != nil || n != 1 {
		t.Fatalf("Complete of the row there now: %d marked, %v; want 1", n, err)
	}
}

// A failure, like a delivery, is written only to the row read: a row that
// took its id since (a failover, a restore, setval) gets no attempt, no
// backoff and above all no dead-letter from a send it never had. Written by
// id alone, a batch in flight across the change whose row failed for good
// dead-lettered the new row unsent.
func TestCompleteFailureLeavesARowThatTookTheIdSince(t *testing.T) {
	t.Parallel()
	st, f, id, rows := idTakenSince(t)
	read := rows[0]
	ctx := context.Background()
	fail := []store.Failure{{ID: id, CreatedAt: read.CreatedAt, Error: "410 gone", Dead: true}}
	if _, n, err := counts(st.ReadPath().Complete(ctx, f, store.Outcomes{Failures: fail})); err != nil || n != 0 {
		t.Errorf("a failure of the row read: %d written, %v; want 0: the row with its id now is another", n, err)
	}
	var attempts int
	var dead bool
	if err := st.Pool().QueryRow(ctx, `SELECT attempts, dead_at IS NOT NULL FROM outbox WHERE id = $1`, id).Scan(&attempts, &dead); err != nil {
		t.Fatal(err)
	}
	if attempts != 0 || dead {
		t.Fatalf("the row that took the id since: attempts %d, dead %v; want 0, false (never sent)", attempts, dead)
	}
	fail[0].CreatedAt = done(t, st, id)[0].CreatedAt
	if _, n, err := counts(st.ReadPath().Complete(ctx, f, store.Outcomes{Failures: fail})); err != nil || n != 1 {
		t.Fatalf("a failure of the row there now: %d written, %v; want 1", n, err)
	}
}

// A row whose created_at is infinite is read with no usable time (it is
// poison, dead-lettered unsent): its failure, with CreatedAt zero, is
// written by id alone.
func TestCompleteFailureOfARowWithAnInfiniteCreatedAt(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	enqueue(t, st, ev("deal", "1", 1))
	id := maxID(t, st)
	exec(t, st, `UPDATE outbox SET created_at = '-infinity' WHERE id = $1`, id)
	f := store.Fence{Lock: "lock:outbox:poller", Token: 1, Owner: "o"}
	if err := st.ClaimFence(ctx, f); err != nil {
		t.Fatal(err)
	}
	if _, n, err := counts(st.ReadPath().Complete(ctx, f, store.Outcomes{Failures: []store.Failure{{ID: id, Error: "poison", Dead: true}}})); err != nil || n != 1 {
		t.Fatalf("the failure of a row with an infinite created_at: %d written, %v; want 1 (dead-lettered)", n, err)
	}
}
