package store_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/store"
)

// The reconciler's sweep statements (the repair's pending rows, the
// attempts histogram, the purge) cost the same behind 200k rows delivered
// while a snapshot was held as on a small table: shared buffers touched, a
// deterministic count. A sweep (every 5 minutes by default) that walks the
// whole delivered history from id 0 costs a buffer or more per row, and a
// purge by id reads the whole table even with no snapshot held. Measured
// as the relay runs them: prepared, generic plans, both the plan made on
// the small table and kept, and the one made after ANALYZE saw the
// history.
func TestSweepCostDoesNotGrowWithHistory(t *testing.T) {
	t.Parallel()
	st, fence := fencedStore(t, "lock:outbox:poller")
	ctx := context.Background()
	conn, err := st.Pool().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for name, sql := range map[string]string{"pr": store.PendingRowsSQL, "pa": store.PendingByAttemptsSQL,
		"pu": store.PurgeSQL(store.PurgeDelivered), "pd": store.PurgeSQL(store.PurgeDead)} {
		if _, err := conn.Conn().Prepare(ctx, name, sql); err != nil {
			t.Fatal(err)
		}
	}
	// Each statement runs once before it is measured: a first run in a
	// session also pays its catalog lookups (the epoch's sequence name),
	// dozens of buffers that have nothing to do with the table's history.
	explain := func(sql string, args ...any) int64 {
		t.Helper()
		explainUndone(t, conn, sql, args...)
		return explainUndone(t, conn, sql, args...)
	}
	// As a sweep runs them: the repair's first batch, the histogram, a
	// purge with nothing old enough (the default 7-day retention).
	measure := func() (pending, attempts, purge, purgeDead int64) {
		cutoff := (168 * time.Hour).Microseconds()
		return explain(`EXECUTE pr(0, 1000, NULL)`), explain(`EXECUTE pa(NULL)`),
			explain(`EXECUTE pu($1, $2, $3, $4, '-infinity', 0, 1000)`, fence.Lock, fence.Token, fence.Owner, cutoff),
			explain(`EXECUTE pd($1, $2, $3, $4, '-infinity', 0, 1000)`, fence.Lock, fence.Token, fence.Owner, cutoff)
	}
	pendingRows := func() {
		var evs []store.Event
		for i := range 10 {
			evs = append(evs, ev("deal", strconv.Itoa(i), i))
		}
		enqueue(t, st, evs...)
	}
	pendingRows()
	// One row backing off, below where the poller's cursor will be.
	exec(t, st, `UPDATE outbox SET attempts = 1, available_at = now() + interval '1 hour' WHERE id = (SELECT min(id) FROM outbox)`)
	p0, a0, u0, d0 := measure()

	// A report's snapshot, held while 200k rows are written and delivered;
	// the poller saves its cursor past them.
	holdSnapshot(t, st)
	exec(t, st, `UPDATE outbox SET dispatched_at = now() WHERE dispatched_at IS NULL AND attempts = 0`)
	exec(t, st, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'deal', (i % 1000)::text, 'deal.happened', '{}' FROM generate_series(1, 200000) i`)
	exec(t, st, `UPDATE outbox SET dispatched_at = now() WHERE dispatched_at IS NULL AND attempts = 0`)
	_, _, _, epoch, err := cursorOf(st.ReadPath().LoadCursor(ctx, fence.Lock))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.ReadPath().SaveCursor(ctx, fence, store.Cursor{At: maxID(t, st), Sent: maxID(t, st), Epoch: epoch}); err != nil {
		t.Fatal(err)
	}
	pendingRows()
	p1, a1, u1, d1 := measure()
	if testing.Verbose() {
		for _, e := range []string{`EXECUTE pr(0, 1000, NULL)`, `EXECUTE pa(NULL)`} {
			rows, _ := conn.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+e, pgx.QueryExecModeSimpleProtocol)
			plan, _ := pgx.CollectRows(rows, pgx.RowTo[string])
			t.Log(strings.Join(plan, "\n"))
		}
	}
	exec(t, st, `ANALYZE outbox`) // new generic plans, from the history's statistics
	p2, a2, u2, d2 := measure()

	// The repair's plan walks no pending index: their entries for the
	// history are walked whole when the planner, after an ANALYZE that saw
	// few pending rows, scans one and sorts.
	planRows, err := conn.Query(ctx, "EXPLAIN EXECUTE pr(0, 1000, NULL)", pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := pgx.CollectRows(planRows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if p := strings.Join(plan, "\n"); strings.Contains(p, "outbox_pending_idx") || strings.Contains(p, "outbox_pending_aggregate_idx") {
		t.Errorf("the repair's rows are read through a pending index, whose history entries a held snapshot keeps:\n%s", p)
	}

	t.Logf("shared buffers, small table -> 200k delivered under a snapshot (kept plan, after ANALYZE): pending rows %d -> %d, %d; attempts %d -> %d, %d; purge %d -> %d, %d; purge dead %d -> %d, %d",
		p0, p1, p2, a0, a1, a2, u0, u1, u2, d0, d1, d2)
	for _, c := range []struct {
		name         string
		before, a, b int64
	}{{"pending rows", p0, p1, p2}, {"attempts histogram", a0, a1, a2}, {"purge", u0, u1, u2}, {"purge dead", d0, d1, d2}} {
		if c.a > 2*c.before+20 || c.b > 2*c.before+20 {
			t.Errorf("%s: %d and %d buffers behind 200k delivered rows, %d before: the sweep walks history", c.name, c.a, c.b, c.before)
		}
	}

	// And they still see what they are for: the row backing off below the
	// cursor and the pending rows above it.
	rows, err := st.Reconcile().PendingRows(ctx, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 11 {
		t.Errorf("pending rows: %d, want 11 (one backing off below the cursor, ten above)", len(rows))
	}
	hist, err := st.Reconcile().PendingByAttempts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if hist[0] != 10 || hist[1] != 1 || len(hist) != 2 {
		t.Errorf("attempts histogram %v, want map[0:10 1:1]", hist)
	}
}

// A purge sweep deletes every delivered row older than the cutoff, in
// batches whose boundary falls inside a group of rows marked together
// (one dispatched_at), and nothing pending or newer.
func TestPurgeWalksBatchesThroughRowsMarkedTogether(t *testing.T) {
	t.Parallel()
	st, fence := fencedStore(t, "lock:reconciliation")
	ctx := context.Background()
	exec(t, st, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'deal', (i % 10)::text, 'deal.happened', '{}' FROM generate_series(1, 2600) i`)
	// Three marks: 1,000 rows two days ago, 1,500 one day ago (one time
	// each), 50 an hour ago; 50 stay pending.
	exec(t, st, `UPDATE outbox SET dispatched_at = now() - interval '2 days' WHERE id <= (SELECT min(id) + 999 FROM outbox)`)
	exec(t, st, `UPDATE outbox SET dispatched_at = now() - interval '1 day' WHERE dispatched_at IS NULL AND id <= (SELECT min(id) + 2499 FROM outbox)`)
	exec(t, st, `UPDATE outbox SET dispatched_at = now() - interval '1 hour' WHERE dispatched_at IS NULL AND id <= (SELECT min(id) + 2549 FROM outbox)`)
	var cursor store.PurgeCursor
	var total int64
	batches := 0
	for {
		n, next, err := purgedOf(st.Reconcile().Purge(ctx, fence, store.PurgeBatch{Kind: store.PurgeDelivered, Age: 2 * time.Hour, After: cursor, Limit: 400}))
		if err != nil {
			t.Fatal(err)
		}
		total, cursor = total+n, next
		batches++
		if n < 400 || batches > 20 {
			break
		}
	}
	var left, pending int64
	if err := st.Pool().QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE dispatched_at IS NULL) FROM outbox`).Scan(&left, &pending); err != nil {
		t.Fatal(err)
	}
	if total != 2500 || left != 100 || pending != 50 {
		t.Errorf("purged %d in %d batches, %d rows left (%d pending); want 2500 purged, 100 left, 50 pending", total, batches, left, pending)
	}
}

// fencedStore is a fresh database whose fence for lock accepted token 1.
func fencedStore(t *testing.T, lock string) (*store.Store, store.Fence) {
	t.Helper()
	st, _ := testenv.Store(t)
	fence := store.Fence{Lock: lock, Token: 1, Owner: "a"}
	if err := st.ClaimFence(context.Background(), fence); err != nil {
		t.Fatal(err)
	}
	return st, fence
}

// The backlog count and the sweep start from the poller's row written
// last, not the lowest: a row left by a retired poller lock name (the
// config's key prefix changed) kept them walking from its old cursor for
// ever. Here the retired row stands at 0, saved a day ago, the current
// one at the top of 2,000 delivered rows; one row at 1,000 is made pending
// again by hand (UPDATE ... SET dispatched_at = NULL), which, below the
// current cursor, counts once the poller's rescan has found it and saved a
// cursor below it (README, "The read path"): counted now, the floor was the
// retired row's.
func TestStaleCursorRowOfARetiredLockDoesNotPinTheFloor(t *testing.T) {
	t.Parallel()
	st, fence := fencedStore(t, "lock:outbox:poller")
	ctx := context.Background()
	var evs []store.Event
	for i := range 2000 {
		evs = append(evs, ev("deal", strconv.Itoa(i%10), i))
	}
	enqueue(t, st, evs...)
	if _, err := st.Pool().Exec(ctx, `UPDATE outbox SET dispatched_at = now()`); err != nil {
		t.Fatal(err)
	}
	var epoch string
	if err := st.Pool().QueryRow(ctx, store.EpochSQL).Scan(&epoch); err != nil {
		t.Fatal(err)
	}
	if err := st.ReadPath().SaveCursor(ctx, fence, store.Cursor{At: 2000, Sent: 2000, Epoch: epoch}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Pool().Exec(ctx, `INSERT INTO outbox_cursor (lock_name, cursor, epoch, sent, updated_at)
		VALUES ('retired:lock:outbox:poller', 0, $1, 0, now() - interval '1 day')`, epoch); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Pool().Exec(ctx, `UPDATE outbox SET dispatched_at = NULL WHERE id = 1000`); err != nil {
		t.Fatal(err)
	}
	stats, err := st.Ops().Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := st.Reconcile().PendingRows(ctx, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if stats.Pending != 0 || len(rows) != 0 {
		t.Fatalf("backlog %d, sweep found %d rows: want 0 and 0, counted from the current lock's cursor 2000, not the retired row's 0", stats.Pending, len(rows))
	}
}
