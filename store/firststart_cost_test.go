package store_test

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/store"
)

// With no cursor saved by a poller in this epoch (a first start, the first
// start after an upgrade onto a table with history), LoadCursor, the
// backlog count (Stats, at each scrape until the save) and the
// reconciler's sweep (PendingRows, PendingByAttempts) take a floor from a
// walk of outbox_pending_idx in id order (store.pendingFloor): each index
// page and each heap page once. Counted from id 0 instead, with few pending rows in
// the planner's estimates (a plan made on a small table and kept, or after
// ANALYZE), they walk outbox_pending_aggregate_idx or the primary key in
// an order that makes each row of history a buffer; the test logs those
// unfloored costs beside the floored ones. The floor still grows with the
// history a held snapshot keeps in the index (no bound is possible without
// a saved cursor); what the test holds is that it stays under one buffer
// per 30 rows of history, at 20k and at 200k rows, in both plans, and that
// every pending row is still counted. The purge does not depend on a
// cursor and stays flat.
func TestFirstStartCostsNoMoreThanOneWalkOfThePendingIndex(t *testing.T) {
	t.Parallel()
	type cost struct{ load, stats, pending, attempts, purge, unflooredLoad, unflooredStats, unflooredPending, unflooredAttempts int64 }
	run := func(t *testing.T, history int) cost {
		st, fence := fencedStore(t, "lock:outbox:poller")
		ctx := context.Background()
		conn, err := st.Pool().Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
		for name, sql := range map[string]string{"st": store.StatsSQL, "pr": store.PendingRowsSQL,
			"pa": store.PendingByAttemptsSQL, "pu": store.PurgeSQL(store.PurgeDelivered), "lc": store.LoadCursorSQL,
			"pf": store.PendingFloorSQL, "lf": store.LoadFloorSQL,
			// LoadCursor unfloored: the lowest pending row in the same statement.
			"lo": strings.Replace(store.LoadCursorSQL, "COALESCE($3::bigint, top.id)",
				"COALESCE((SELECT min(id) - 1 FROM outbox WHERE dispatched_at IS NULL AND dead_at IS NULL) + 0 * $3::bigint, top.id)", 1)} {
			if _, err := conn.Conn().Prepare(ctx, name, sql); err != nil {
				t.Fatal(err)
			}
		}
		explain := func(sql string, args ...any) int64 {
			t.Helper()
			explainUndone(t, conn, sql, args...)
			return explainUndone(t, conn, sql, args...)
		}
		explainStats := func(args ...any) int64 { // as Stats runs it: store.StatsSettings
			t.Helper()
			explainUndoneJSONWith(t, conn, store.StatsSettings, `EXECUTE st($1)`, args...)
			return planBuffers(t, explainUndoneJSONWith(t, conn, store.StatsSettings, `EXECUTE st($1)`, args...))
		}
		cutoff := (168 * time.Hour).Microseconds()
		measure := func() cost {
			floor, err := st.Reconcile().SweepFloor(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if floor == nil {
				t.Fatal("a cursor is saved")
			}
			pf, lf := explainFloor(t, conn, "pf"), explainFloor(t, conn, "lf")
			return cost{lf + explain(`EXECUTE lc($1, $2, $3)`, fence.Lock, 10_000, *floor),
				pf + explainStats(*floor), pf + explain(`EXECUTE pr(0, 1000, $1)`, *floor),
				pf + explain(`EXECUTE pa($1)`, *floor),
				explain(`EXECUTE pu($1, $2, $3, $4, '-infinity', 0, 1000)`, fence.Lock, fence.Token, fence.Owner, cutoff),
				// Unfloored: from id 0 (a floor of 0).
				explain(`EXECUTE lo($1, $2, 0)`, fence.Lock, 10_000), explainStats(0), explain(`EXECUTE pr(0, 1000, 0)`),
				explain(`EXECUTE pa(0)`)}
		}
		// One row backing off, below the history: the floor is not held
		// down by it (outbox_backoff_idx finds it).
		enqueue(t, st, ev("deal", "x", 0))
		exec(t, st, `UPDATE outbox SET attempts = 1, available_at = now() + interval '1 hour'`)
		measure() // the generic plans, made on the small table and kept, as a relay's sessions keep them
		holdSnapshot(t, st)
		exec(t, st, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
			SELECT 'deal', (i % 1000)::text, 'deal.happened', '{}' FROM generate_series(1, $1::int) i`, history)
		exec(t, st, `UPDATE outbox SET dispatched_at = now() WHERE dispatched_at IS NULL AND attempts = 0`)
		var evs []store.Event
		for i := range 10 {
			evs = append(evs, ev("deal", strconv.Itoa(i), i))
		}
		enqueue(t, st, evs...)
		kept := measure()
		exec(t, st, `ANALYZE outbox`) // new generic plans, from the history's statistics
		analyzed := measure()
		t.Logf("history %d: kept plans %+v, after ANALYZE %+v", history, kept, analyzed)

		// Still exact: eleven pending (one backing off, the oldest), and
		// the computed cursor is just below the lowest pending row.
		stats, err := st.Ops().Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if stats.Pending != 11 || stats.OldestPendingAge <= 0 {
			t.Errorf("history %d, no cursor saved: stats %+v, want 11 pending", history, stats)
		}
		rows, err := st.Reconcile().PendingRows(ctx, 0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		hist, err := st.Reconcile().PendingByAttempts(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) != 11 || hist[0] != 10 || hist[1] != 1 || len(hist) != 2 {
			t.Errorf("history %d, no cursor saved: %d pending rows, attempts %v; want 11, map[0:10 1:1]", history, len(rows), hist)
		}
		var low int64
		if err := st.Pool().QueryRow(ctx, `SELECT min(id) FROM outbox WHERE dispatched_at IS NULL`).Scan(&low); err != nil {
			t.Fatal(err)
		}
		if c, _, h, _, err := cursorOf(st.ReadPath().LoadCursor(ctx, fence.Lock)); err != nil || c != low-1 || h == 0 {
			t.Errorf("history %d: LoadCursor %d (horizon %d, %v), want %d with a horizon", history, c, h, err, low-1)
		}
		return cost{max(kept.load, analyzed.load), max(kept.stats, analyzed.stats), max(kept.pending, analyzed.pending),
			max(kept.attempts, analyzed.attempts), max(kept.purge, analyzed.purge),
			max(kept.unflooredLoad, analyzed.unflooredLoad), max(kept.unflooredStats, analyzed.unflooredStats), max(kept.unflooredPending, analyzed.unflooredPending),
			max(kept.unflooredAttempts, analyzed.unflooredAttempts)}
	}
	var small, large cost
	t.Run("20k", func(t *testing.T) { t.Parallel(); small = run(t, 20_000) })
	t.Run("200k", func(t *testing.T) { t.Parallel(); large = run(t, 200_000) })
	t.Cleanup(func() {
		t.Logf("shared buffers (the worse of the kept plan and the plan after ANALYZE), no cursor saved, 20k -> 200k rows delivered under a held snapshot: LoadCursor %d -> %d (unfloored %d -> %d); stats %d -> %d (unfloored %d -> %d); pending rows %d -> %d (unfloored %d -> %d); attempts %d -> %d (unfloored %d -> %d); purge %d -> %d",
			small.load, large.load, small.unflooredLoad, large.unflooredLoad, small.stats, large.stats, small.unflooredStats, large.unflooredStats,
			small.pending, large.pending, small.unflooredPending, large.unflooredPending, small.attempts, large.attempts, small.unflooredAttempts, large.unflooredAttempts,
			small.purge, large.purge)
		for _, c := range []struct {
			name      string
			v20, v200 int64
		}{{"LoadCursor", small.load, large.load}, {"stats", small.stats, large.stats}, {"pending rows", small.pending, large.pending}, {"attempts histogram", small.attempts, large.attempts}} {
			for _, x := range []struct{ v, h int64 }{{c.v20, 20_000}, {c.v200, 200_000}} {
				if x.v > x.h/30 {
					t.Errorf("%s with no cursor saved: %d buffers behind %d rows of history, more than one per 30 rows: more than one walk of the pending index in id order (the history walked in another order, or a count from id 0)", c.name, x.v, x.h)
				}
			}
		}
		if large.purge > 2*small.purge+20 {
			t.Errorf("purge: %d buffers behind 200k rows, %d behind 20k: it walks history", large.purge, small.purge)
		}
	})
}

// explainFloor is explainUndone for a floor statement (store.pendingFloor),
// run as the store runs it: with its settings (store.FloorSettings). Run
// twice, the second measured.
func explainFloor(t *testing.T, conn *pgxpool.Conn, name string) int64 {
	t.Helper()
	ctx := context.Background()
	var n int64
	for range 2 {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, set := range store.FloorSettings {
			if _, err := tx.Exec(ctx, set); err != nil {
				t.Fatal(err)
			}
		}
		var raw []byte
		if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE "+name, pgx.QueryExecModeSimpleProtocol).Scan(&raw); err != nil {
			t.Fatal(err)
		}
		_ = tx.Rollback(ctx)
		n = planBuffers(t, raw)
	}
	return n
}

// The floor statements walk outbox_pending_idx, the narrowest index
// holding every pending row's id in id order, whether the plan was made on
// a table never analyzed or after ANALYZE: outbox_pending_aggregate_idx has
// the same predicate and about three times the pages, and the primary key
// holds every row.
func TestFloorWalksTheNarrowPendingIndex(t *testing.T) {
	t.Parallel()
	st, conn := floorConn(t)
	ctx := context.Background()
	// Sizes at which, never analyzed, the planner prices a bitmap of either
	// pending index within a hair of the other.
	exec(t, st, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'deal', (i % 1000)::text, 'deal.happened', '{}' FROM generate_series(1, 220000) i`)
	exec(t, st, `UPDATE outbox SET dispatched_at = now() WHERE id <= 200000`)
	for _, analyze := range []bool{false, true} {
		if analyze {
			exec(t, st, `ANALYZE outbox`)
		}
		for name, sql := range map[string]string{"pending_floor": store.PendingFloorSQL, "load_floor": store.LoadFloorSQL} {
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, set := range append(store.FloorSettings, `SET LOCAL plan_cache_mode = force_generic_plan`) {
				if _, err := tx.Exec(ctx, set); err != nil {
					t.Fatal(err)
				}
			}
			var raw []byte
			if err := tx.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+sql).Scan(&raw); err != nil {
				t.Fatal(err)
			}
			_ = tx.Rollback(ctx)
			if got := planIndexes(t, raw); !slices.Equal(got, []string{"outbox_pending_idx"}) {
				t.Errorf("%s (analyzed %v) reads %v, want [outbox_pending_idx]", name, analyze, got)
			}
		}
	}
}

// planIndexes lists the indexes an EXPLAIN (FORMAT JSON) plan reads.
func planIndexes(t *testing.T, raw []byte) []string {
	t.Helper()
	type node struct {
		Index string `json:"Index Name"`
		Plans []node `json:"Plans"`
	}
	var plan []struct {
		Plan node `json:"Plan"`
	}
	if err := json.Unmarshal(raw, &plan); err != nil || len(plan) != 1 {
		t.Fatalf("explain: %v %s", err, raw)
	}
	var out []string
	var walk func(n node)
	walk = func(n node) {
		if n.Index != "" {
			out = append(out, n.Index)
		}
		for _, c := range n.Plans {
			walk(c)
		}
	}
	walk(plan[0].Plan)
	return out
}

// Without history the floor is the backlog's first row, found in a few
// buffers whatever the backlog's size, in a plan made on a small table
// and kept as in one made after ANALYZE: a bitmap of the pending index
// would read the heap page of every pending row before answering.
func TestFloorStopsAtTheBacklogsFirstRow(t *testing.T) {
	t.Parallel()
	st, conn := floorConn(t)
	enqueue(t, st, ev("deal", "0", 0))
	explainFloor(t, conn, "pf") // the plans, made on a one-row table and kept
	explainFloor(t, conn, "lf")
	exec(t, st, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'deal', (i % 1000)::text, 'deal.happened', '{}' FROM generate_series(1, 50000) i`)
	for _, analyze := range []bool{false, true} {
		if analyze {
			exec(t, st, `ANALYZE outbox`)
		}
		for _, name := range []string{"pf", "lf"} {
			if b := explainFloor(t, conn, name); b > 20 {
				t.Errorf("%s (analyzed %v) read %d buffers for the first of 50,001 pending rows, want at most 20: it reads every pending row", name, analyze, b)
			}
		}
	}
}

// floorConn is a store of its own and a connection of its pool, released at
// cleanup, on which the floor statements are prepared: pending_floor as
// "pf", load_floor as "lf".
func floorConn(t *testing.T) (*store.Store, *pgxpool.Conn) {
	t.Helper()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	conn, err := st.Pool().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Release)
	for name, sql := range map[string]string{"pf": store.PendingFloorSQL, "lf": store.LoadFloorSQL} {
		if _, err := conn.Conn().Prepare(ctx, name, sql); err != nil {
			t.Fatal(err)
		}
	}
	return st, conn
}
