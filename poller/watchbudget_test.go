package poller

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// A run of gaps still holding is looked up maxWatchPerRead ids a read
// from its lowest; the first id not looked up is passed as a holding gap
// all the same (watch, the marker), so the hold stays below it. Here two
// open transactions leave one run: the first holds exactly the ids a read
// looks up, the second the next ones, with rows of aggregate X, and a row
// of X is committed above. When the first commits, every id looked up is
// visible: without the marker that read released the row above, and X's
// later row went before the second transaction's rows of X.
func TestHoldingRunBeyondTheWatchBudgetStillHolds(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	cfg := testConfig()
	cfg.GapWait = 10 * time.Minute // the gaps hold throughout
	cfg.LockTTL = 30 * time.Second
	// A read scans past the first transaction's rows once they commit, up
	// to the rows above the second's.
	cfg.BatchSize = 2 * maxWatchPerRead
	r, _ := e.loggedRunner(cfg)
	e.run(r)
	warm := e.produce("warm")
	e.waitFor("the runner delivering", time.Minute, func() bool { return e.delivered(warm) })

	open := func(agg string, n int) (tx pgx.Tx, lo, hi int64) {
		tx, err := e.st.Pool().Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		if err := tx.QueryRow(ctx, `WITH ins AS (INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
			SELECT 'deal', $1, 'deal.funded', '{}' FROM generate_series(1, $2::int) RETURNING id)
			SELECT min(id), max(id) FROM ins`, agg, n).Scan(&lo, &hi); err != nil {
			t.Fatal(err)
		}
		return tx, lo, hi
	}
	first, lo, hi := open("bulk", maxWatchPerRead)
	second, lo2, hi2 := open("X", 10)
	if lo != warm+1 || hi != lo+maxWatchPerRead-1 || lo2 != hi+1 || hi2 != lo2+9 {
		t.Fatalf("premise: ids %d..%d and %d..%d, want %d consecutive from %d, then 10", lo, hi, lo2, hi2, maxWatchPerRead, warm+1)
	}
	above := e.produce("X")
	other := e.produce("other")
	e.waitFor("the open transactions' ids watched as gaps", 20*time.Second, func() bool {
		return r.gapRuns.Load() > 0
	})
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	e.waitFor("the first transaction's rows delivered", time.Minute, func() bool {
		return e.count("aggregate_id = 'bulk' AND dispatched_at IS NULL") == 0
	})
	if e.delivered(above) || e.delivered(other) {
		t.Fatalf("rows %d and %d above the open transaction's ids %d..%d: delivered %v, %v; want held",
			above, other, lo2, hi2, e.delivered(above), e.delivered(other))
	}
	if err := second.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	e.waitAllDispatched(time.Minute)
	e.checkOrder()
}
