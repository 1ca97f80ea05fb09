package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/outboxd/outboxd/store"
)

// A row an operator makes pending again while a purge is deleting it is
// kept: the purge waits for the operator's row lock, and Postgres then
// re-checks only the DELETE's own conditions against the row's new
// version (READ COMMITTED), not the subquery that chose the ids. With the
// age condition only in the subquery the row was deleted: an event its
// operator had just asked to send again, lost.
func TestPurgeKeepsARowMadePendingWhileItRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, kind := range []store.PurgeKind{store.PurgeDelivered, store.PurgeDead} {
		st, fence := fencedStore(t, "lock:reconciliation")
		col := map[store.PurgeKind]string{store.PurgeDelivered: "dispatched_at", store.PurgeDead: "dead_at"}[kind]
		exec(t, st, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
			SELECT 'deal', i::text, 'deal.happened', '{}' FROM generate_series(1, 3) i`)
		exec(t, st, `UPDATE outbox SET `+col+` = now() - interval '2 days'`)
		var id int64
		if err := st.Pool().QueryRow(ctx, `SELECT min(id) FROM outbox`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		op, err := st.Pool().Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := op.Exec(ctx, `UPDATE outbox SET dispatched_at = NULL, dead_at = NULL, attempts = 0 WHERE id = $1`, id); err != nil {
			t.Fatal(err)
		}
		type result struct {
			n   int64
			err error
		}
		done := make(chan result, 1)
		go func() {
			n, _, err := purgedOf(st.Reconcile().Purge(ctx, fence, store.PurgeBatch{Kind: kind, Age: time.Hour, After: store.PurgeCursor{}, Limit: 100}))
			done <- result{n, err}
		}()
		// The purge is waiting for the operator's row lock.
		waitForLockWait(t, st)
		if err := op.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		res := <-done
		if res.err != nil {
			t.Fatal(res.err)
		}
		var pending int64
		if err := st.Pool().QueryRow(ctx, `SELECT count(*) FROM outbox WHERE id = $1 AND dispatched_at IS NULL AND dead_at IS NULL`, id).Scan(&pending); err != nil {
			t.Fatal(err)
		}
		if pending != 1 || res.n != 2 {
			t.Fatalf("%s purge: deleted %d rows, the row made pending meanwhile kept: %v; want 2 deleted and it kept", col, res.n, pending == 1)
		}
	}
}

// waitForLockWait waits until a session of st's database waits for a lock.
func waitForLockWait(t *testing.T, st *store.Store) {
	t.Helper()
	for range 200 {
		var n int
		if err := st.Pool().QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("the purge never waited for the operator's row lock")
}
