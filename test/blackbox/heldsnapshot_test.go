package blackbox

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testkit"
)

// The built binary's Postgres work per event does not grow with the rows
// it delivered while a snapshot was held elsewhere (a report, pg_dump, an
// idle-in-transaction session): vacuum can remove none of their old
// versions or index entries, and a read or a delivery write that walks
// them slows the relay down without bound. 20k events, then 200k
// delivered under the snapshot, then 20k again; it compares the buffers
// the outbox table and its indexes were asked for per event
// (pg_statio_user_tables: every backend, the relay's reads, marks and
// cursor saves alike), not times: a statement whose plan walks history
// fails it. A plan that costs CPU but no buffers does not.
func TestHeldSnapshotCostDoesNotGrowWithHistory(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("220k events through the binary")
	}
	e := setup(t)
	e.set("OUTBOXD_DISPATCH_SINK", "noop", "OUTBOXD_POLLER_LOCK_TTL", "30s")
	ctx := context.Background()
	// Autovacuum counts in pg_statio too; it is off on the CI server, on a
	// fresh Debian install it is not, and under the snapshot it would walk
	// the whole table while we measure.
	if _, err := e.pool.Exec(ctx, `ALTER TABLE outbox SET (autovacuum_enabled = off)`); err != nil {
		t.Fatal(err)
	}
	holder, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(ctx) }()
	if _, err := holder.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ`); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, `SELECT count(*) FROM outbox`); err != nil { // takes the snapshot
		t.Fatal(err)
	}
	e.start()

	// buffers: what the outbox table, its indexes and TOAST were asked for
	// so far. A backend reports its counts at most once a second; one that
	// goes idle within a second of its last report holds the rest for up to
	// 10 s (PGSTAT_IDLE_INTERVAL), so the caller lets reported settle.
	buffers := func() int64 {
		var n int64
		if err := e.pool.QueryRow(ctx, `SELECT COALESCE(heap_blks_hit, 0) + COALESCE(heap_blks_read, 0)
			+ COALESCE(idx_blks_hit, 0) + COALESCE(idx_blks_read, 0)
			+ COALESCE(toast_blks_hit, 0) + COALESCE(toast_blks_read, 0)
			+ COALESCE(tidx_blks_hit, 0) + COALESCE(tidx_blks_read, 0)
			FROM pg_statio_user_tables WHERE relname = 'outbox'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// deliver inserts n events over 100 aggregates and waits until they are
	// delivered, probing only the highest id (a primary-key lookup: a count
	// of pending rows would itself walk the history it is measuring). It
	// waits as long as the relay's saved cursor moves: 200k events took
	// over 20 s in a suite run at load ~10, and how fast they go is a
	// benchmark's figure, not this test's.
	deliver := func(n int) {
		ids := e.insertMany("deal", 100, n/100)
		last := ids[len(ids)-1]
		testkit.WaitProgressing(t, waitTimeout, fmt.Sprintf("event %d delivered", last), func() bool {
			var done bool
			if err := e.pool.QueryRow(ctx, `SELECT dispatched_at IS NOT NULL FROM outbox WHERE id = $1`, last).Scan(&done); err != nil {
				t.Fatal(err)
			}
			return done
		}, func() int64 {
			var c int64
			if err := e.pool.QueryRow(ctx, `SELECT COALESCE(max(cursor), 0) FROM outbox_cursor`).Scan(&c); err != nil {
				t.Fatal(err)
			}
			return c
		}, nil)
	}
	const batch = 20_000
	const reported = 11 * time.Second
	measure := func() float64 {
		before := buffers()
		deliver(batch)
		time.Sleep(reported)
		return float64(buffers()-before) / batch
	}

	fresh := measure()
	deliver(200_000)
	time.Sleep(reported) // the history's own counts are not the next phase's
	behind := measure()
	if n := e.count("dispatched_at IS NULL AND dead_at IS NULL"); n != 0 {
		t.Fatalf("%d events still pending", n)
	}
	var dead int64 // old row versions the snapshot keeps
	if err := e.pool.QueryRow(ctx, `SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'outbox'`).Scan(&dead); err != nil {
		t.Fatal(err)
	}
	t.Logf("outbox buffers per event: %.2f on a fresh table, %.2f behind 200k events delivered under a held snapshot (%d dead row versions)", fresh, behind, dead)
	// Index depth and a table that no longer fits in cache cost a little;
	// a walk of the history costs thousands of buffers per read.
	if behind > 1.5*fresh+2 {
		t.Fatalf("outbox buffers per event grew with history under a held snapshot: %.2f on a fresh table, %.2f behind 200k delivered rows (want at most 1.5x + 2)", fresh, behind)
	}
}
