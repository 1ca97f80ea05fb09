package store_test

import (
	"context"
	"encoding/json"
	"maps"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/migrations"
	"github.com/outboxd/outboxd/store"
)

// buffers runs EXPLAIN (ANALYZE, BUFFERS) of sql and returns the shared
// blocks it touched (hit + read), the whole plan's.
func buffers(t *testing.T, st *store.Store, sql string, args ...any) int64 {
	t.Helper()
	var raw []byte
	if err := st.Pool().QueryRow(context.Background(), "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sql, args...).Scan(&raw); err != nil {
		t.Fatal(err)
	}
	return planBuffers(t, raw)
}

// explainUndone runs EXPLAIN (ANALYZE, BUFFERS) of sql (an EXECUTE of a
// statement prepared on conn) in a transaction it rolls back, so writes are
// measured and undone, and returns the shared blocks it touched.
func explainUndone(t *testing.T, conn *pgxpool.Conn, sql string, args ...any) int64 {
	t.Helper()
	return planBuffers(t, explainUndoneJSON(t, conn, sql, args...))
}

// explainUndoneJSON is explainUndone's EXPLAIN output (FORMAT JSON).
func explainUndoneJSON(t *testing.T, conn *pgxpool.Conn, sql string, args ...any) []byte {
	t.Helper()
	return explainUndoneJSONWith(t, conn, nil, sql, args...)
}

// explainUndoneJSONWith is explainUndoneJSON with settings (SET LOCAL
// statements) run first in its transaction, as the store runs a statement
// planned under them (store.StatsSettings).
func explainUndoneJSONWith(t *testing.T, conn *pgxpool.Conn, settings []string, sql string, args ...any) []byte {
	t.Helper()
	ctx := context.Background()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for _, set := range settings {
		if _, err := tx.Exec(ctx, set); err != nil {
			t.Fatal(err)
		}
	}
	var raw []byte
	// EXECUTE's arguments as literals: the prepared statement is run.
	args = append([]any{pgx.QueryExecModeSimpleProtocol}, args...)
	if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sql, args...).Scan(&raw); err != nil {
		t.Fatal(err)
	}
	return raw
}

// privateStore is a store on a migrated database of a server of the
// test's own (testenv.StartPostgresServer), closed at cleanup: for what
// depends on every transaction of the cluster.
func privateStore(t *testing.T) *store.Store {
	t.Helper()
	pg := testenv.StartPostgresServer(t)
	if _, err := migrations.Up(context.Background(), pg.DSN, nil); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(context.Background(), pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st
}

// holdSnapshot opens a REPEATABLE READ transaction and takes its snapshot,
// as a report would: until the test ends, no row version live now can be
// vacuumed, nor its index entries.
func holdSnapshot(t *testing.T, st *store.Store) {
	t.Helper()
	ctx := context.Background()
	holder, err := st.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = holder.Rollback(ctx) })
	if _, err := holder.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ`); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, `SELECT count(*) FROM outbox_fence`); err != nil {
		t.Fatal(err)
	}
}

// planBuffers reads the whole plan's shared blocks touched (hit + read)
// from EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) output.
func planBuffers(t *testing.T, raw []byte) int64 {
	t.Helper()
	var plan []struct {
		Plan struct {
			Hit  int64 `json:"Shared Hit Blocks"`
			Read int64 `json:"Shared Read Blocks"`
		} `json:"Plan"`
	}
	if err := json.Unmarshal(raw, &plan); err != nil || len(plan) != 1 {
		t.Fatalf("explain: %v %s", err, raw)
	}
	return plan[0].Plan.Hit + plan[0].Plan.Read
}

func maxID(t *testing.T, st *store.Store) int64 {
	t.Helper()
	var id int64
	if err := st.Pool().QueryRow(context.Background(), `SELECT COALESCE(max(id), 0) FROM outbox`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// The cursor a holder saves is fenced: a stale holder cannot move it.
func TestSaveCursorIsFenced(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	lock := "lock:outbox:poller"
	c, _, _, epoch, err := cursorOf(st.ReadPath().LoadCursor(ctx, lock))
	if err != nil || c != 0 || epoch == "" {
		t.Fatalf("no cursor saved: %d, epoch %q, %v", c, epoch, err)
	}
	if err := st.ReadPath().SaveCursor(ctx, store.Fence{Lock: lock, Token: 2, Owner: "b"}, store.Cursor{At: 42, Sent: 50, Epoch: epoch}); err != nil {
		t.Fatal(err)
	}
	if err := st.ReadPath().SaveCursor(ctx, store.Fence{Lock: lock, Token: 1, Owner: "a"}, store.Cursor{At: 7, Sent: 90, Epoch: epoch}); err == nil {
		t.Fatal("a stale holder saved its cursor")
	}
	if c, sent, h, _, _ := cursorOf(st.ReadPath().LoadCursor(ctx, lock)); c != 42 || sent != 50 || h != 0 {
		t.Fatalf("cursor %d, sent %d, horizon %d; want the saved 42 and 50, settled (horizon 0)", c, sent, h)
	}
	// Ids start again: the saved cursor is of the old ids, and not used.
	if _, err := st.Pool().Exec(ctx, `TRUNCATE outbox RESTART IDENTITY`); err != nil {
		t.Fatal(err)
	}
	if c, _, _, e2, _ := cursorOf(st.ReadPath().LoadCursor(ctx, lock)); c != 0 || e2 == epoch {
		t.Fatalf("after TRUNCATE ... RESTART IDENTITY: cursor %d (epoch %q, was %q), want 0 in a new epoch", c, e2, epoch)
	}
}

// sevenRows is a fresh outbox of ids 1-7 over aggregates A (1, 3, 4), B
// (2, 5) and C (6, 7), with the ids given dispatched.
func sevenRows(t *testing.T, dispatched ...int64) (*store.Store, context.Context) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	enqueue(t, st, ev("deal", "A", 1), ev("deal", "B", 2), ev("deal", "A", 3), ev("deal", "A", 4),
		ev("deal", "B", 5), ev("deal", "C", 6), ev("deal", "C", 7))
	if _, err := st.Pool().Exec(ctx, `UPDATE outbox SET dispatched_at = now() WHERE id = ANY ($1)`, dispatched); err != nil {
		t.Fatal(err)
	}
	return st, ctx
}

// LaterSent names, for each row given, the highest dispatched row of its
// aggregate above it and at or below the sent mark, and nothing for rows
// with none (a later row still pending, or dispatched above the mark).
func TestLaterSentFindsDispatchedLaterRowsOfTheAggregate(t *testing.T) {
	// 3 and 4 (A) and 7 (C) dispatched; 5 (B) pending; 1, 2 and 6 the rows asked about.
	st, ctx := sevenRows(t, 3, 4, 7)
	rows := []store.Row{{ID: 1, AggregateType: "deal", AggregateID: "A"}, {ID: 2, AggregateType: "deal", AggregateID: "B"},
		{ID: 6, AggregateType: "deal", AggregateID: "C"}}
	got, err := st.ReadPath().LaterSent(ctx, rows, 6)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[1] != 4 {
		t.Fatalf("LaterSent up to 6: %v, want only 1 -> 4 (2's later row is pending, 6's is above the mark)", got)
	}
	if got, err := st.ReadPath().LaterSent(ctx, rows, 7); err != nil || len(got) != 2 || got[6] != 7 {
		t.Fatalf("LaterSent up to 7: %v, %v; want 1 -> 4 and 6 -> 7", got, err)
	}
	// A replayed or retried row is no late commit: it was tried before.
	if _, err := st.Pool().Exec(ctx, `UPDATE outbox SET available_at = now() + interval '1 hour' WHERE id = 1;
		UPDATE outbox SET attempts = 1 WHERE id = 6`); err != nil {
		t.Fatal(err)
	}
	if got, err := st.ReadPath().LaterSent(ctx, rows, 7); err != nil || len(got) != 0 {
		t.Fatalf("LaterSent after a replay and a retry: %v, %v; want none", got, err)
	}
}

// InheritedLate names the untried pending rows of the range with a later
// dispatched row of their aggregate in it, and the ids with no row visible;
// it says so when there are more of either than the limit.
func TestInheritedLateNamesLateRowsAndMissingIDs(t *testing.T) {
	// 3 (A) and 7 (C) dispatched; 1 and 4 (A), 2 and 5 (B), 6 (C) pending.
	st, ctx := sevenRows(t, 3, 7)
	if _, err := st.Pool().Exec(ctx, `DELETE FROM outbox WHERE id = 5`); err != nil {
		t.Fatal(err)
	}
	in, complete, err := lateOf(st.ReadPath().InheritedLate(ctx, store.InheritedRange{Lo: 0, Hi: 9, Limit: 10}))
	wantLate := map[int64]int64{1: 3, 6: 7}
	wantHoles := []store.Hole{{After: 4, Before: 6}}
	if err != nil || !complete || !maps.Equal(in.Late, wantLate) || !slices.Equal(in.Holes, wantHoles) {
		t.Fatalf("InheritedLate(0, 9): %+v, %v, %v; want late %v (4 is above A's dispatched row, B has none dispatched), holes %v (5 deleted; 8-9 not written, but above the highest dispatched id)",
			in, complete, err, wantLate, wantHoles)
	}
	for id, want := range map[int64]bool{4: false, 5: true, 6: false, 7: false, 8: false} {
		if in.InHole(id) != want {
			t.Fatalf("InHole(%d) = %v, want %v (holes %v)", id, !want, want, in.Holes)
		}
	}
	if in, _, err := lateOf(st.ReadPath().InheritedLate(ctx, store.InheritedRange{Lo: 1, Hi: 6, Limit: 10})); err != nil || len(in.Late) != 0 || len(in.Holes) != 0 {
		t.Fatalf("InheritedLate(1, 6): %+v, %v; want no late row (1 is below the range, 7 above), no hole (5 is above 3, the highest dispatched)", in, err)
	}
	if in, complete, err := lateOf(st.ReadPath().InheritedLate(ctx, store.InheritedRange{Lo: 0, Hi: 7, Limit: 1})); err != nil || complete || in != nil {
		t.Fatalf("InheritedLate(0, 7) with limit 1: %+v, %v, %v; want incomplete (1 and 6 late)", in, complete, err)
	}
	// A replayed or retried row is no late commit: it was tried before.
	if _, err := st.Pool().Exec(ctx, `UPDATE outbox SET available_at = now() + interval '1 hour' WHERE id = 1;
		UPDATE outbox SET attempts = 1 WHERE id = 6`); err != nil {
		t.Fatal(err)
	}
	if in, _, err := lateOf(st.ReadPath().InheritedLate(ctx, store.InheritedRange{Lo: 0, Hi: 7, Limit: 10})); err != nil || len(in.Late) != 0 {
		t.Fatalf("InheritedLate after a replay and a retry: %+v, %v; want no late row", in, err)
	}
	// The ids missing just below the highest dispatched one, and at the
	// range's start.
	if _, err := st.Pool().Exec(ctx, `DELETE FROM outbox WHERE id = 6`); err != nil {
		t.Fatal(err)
	}
	for _, lo := range []int64{0, 4} {
		if in, _, err := lateOf(st.ReadPath().InheritedLate(ctx, store.InheritedRange{Lo: lo, Hi: 9, Limit: 10})); err != nil || !slices.Equal(in.Holes, []store.Hole{{After: 4, Before: 7}}) {
			t.Fatalf("InheritedLate(%d, 9) with 5 and 6 deleted: %+v, %v; want the hole (4, 7)", lo, in, err)
		}
	}
}

// Rows at or above the sent mark cannot have a later dispatched row at or
// below it, and LaterSent does not ask Postgres about them: a holder's
// first rows above a computed cursor cost no query (a query there would
// walk the aggregates' whole history). A cancelled context shows whether it asked.
func TestLaterSentAsksNothingForRowsAtOrAboveTheMark(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rows := []store.Row{{ID: 10, AggregateType: "deal", AggregateID: "A"}, {ID: 11, AggregateType: "deal", AggregateID: "B"}}
	if got, err := st.ReadPath().LaterSent(ctx, rows, 10); err != nil || len(got) != 0 {
		t.Fatalf("LaterSent of rows at or above the mark: %v, %v; want nothing, without a query", got, err)
	}
	if _, err := st.ReadPath().LaterSent(ctx, rows, 11); err == nil {
		t.Fatal("LaterSent of a row below the mark did not query (the cancelled context should have failed it)")
	}
}

// With no cursor saved, a holder starts below the lowest pending row (or at
// the highest id when none is pending), not at 0: a first start onto a table
// with history must not walk it a span at a time.
func TestLoadCursorWithoutOneSavedSkipsTheSettledHistory(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	lock := "lock:outbox:poller"
	if _, err := st.Pool().Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, dispatched_at)
		SELECT 'deal', g::text, 'x', '{}', now() FROM generate_series(1, 20500) g`); err != nil {
		t.Fatal(err)
	}
	if c, sent, h, _, err := cursorOf(st.ReadPath().LoadCursor(ctx, lock)); err != nil || c != 10500 || sent != 20500 || h == 0 {
		t.Fatalf("nothing pending: cursor %d, sent %d, horizon %d, %v; want a span below the highest id, 10500, "+
			"the highest id as the sent mark (none known), with a horizon", c, sent, h, err)
	}
	enqueue(t, st, ev("deal", "A", 1), ev("deal", "B", 2))
	if _, err := st.Pool().Exec(ctx, `UPDATE outbox SET dispatched_at = NULL WHERE id = 300`); err != nil {
		t.Fatal(err)
	}
	if c, _, _, _, err := cursorOf(st.ReadPath().LoadCursor(ctx, lock)); err != nil || c != 299 {
		t.Fatalf("row 300 pending: cursor %d, %v; want 299", c, err)
	}
	if _, err := st.Pool().Exec(ctx, `UPDATE outbox SET dispatched_at = now() WHERE id = 300`); err != nil {
		t.Fatal(err)
	}
	if c, _, _, _, err := cursorOf(st.ReadPath().LoadCursor(ctx, lock)); err != nil || c != 10502 {
		t.Fatalf("two pending at the top: cursor %d, %v; want a span below the highest id (10502)", c, err)
	}
}

// The relay's sessions never JIT-compile: with 1M pending rows the read's
// estimated cost passed jit_above_cost and compiling took ~400 ms of a
// 441 ms read. Nor do they start parallel workers: the backlog count's
// opaque conditions are estimated at half the table, and it started two
// workers on every scrape. A DSN that sets either keeps its own.
func TestSessionsDoNotJITOrGoParallel(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	for _, c := range []struct{ setting, want string }{{"jit", "off"}, {"max_parallel_workers_per_gather", "0"}} {
		var got string
		if err := st.Pool().QueryRow(context.Background(), "SHOW "+c.setting).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != c.want {
			t.Errorf("%s = %s in the relay's sessions, want %s", c.setting, got, c.want)
		}
	}
}

// The relay's hot-path statements (the read, the batch's fenced write, the
// cursor save) cost the same behind 200k rows delivered while a snapshot
// was held as on an empty table: shared buffers touched, a deterministic
// count. Each runs as the relay runs it, a statement prepared on one
// session whose generic plan (plan_cache_mode = force_generic_plan) was
// made while the table was empty and is kept. That catches a plan that
// was right for an empty table and walks the whole table once it grew (a
// sequential scan for the read's lookups by id), an index scan that starts
// below the cursor, and a row the fenced writes update on every batch (its
// dead versions, one per write, are walked by the next write).
func TestHotPathCostDoesNotGrowWithHistory(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	fence := store.Fence{Lock: "lock:outbox:poller", Token: 1, Owner: "a"}
	if err := st.ClaimFence(ctx, fence); err != nil {
		t.Fatal(err)
	}
	_, _, _, epoch, err := cursorOf(st.ReadPath().LoadCursor(ctx, fence.Lock))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := st.Pool().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for name, sql := range map[string]string{"rd": store.ReadSQL, "cp": store.CompleteSQL, "sc": store.SaveCursorSQL, "st": store.StatsSQL} {
		if _, err := conn.Conn().Prepare(ctx, name, sql); err != nil {
			t.Fatal(err)
		}
	}
	explain := func(sql string, args ...any) int64 {
		t.Helper()
		return explainUndone(t, conn, sql, args...)
	}
	lim := store.FetchLimits{Rows: 100, RowBytes: 1 << 20, Bytes: 16 << 20}
	// One probe per statement from the cursor on: ten pending rows above
	// it, a watched gap below it (so every lookup by id runs), one row to
	// mark delivered.
	measure := func() (read, complete, save, stats int64) {
		cursor := maxID(t, st)
		var evs []store.Event
		for i := range 10 {
			evs = append(evs, ev("deal", strconv.Itoa(i), i))
		}
		enqueue(t, st, evs...)
		args, _ := store.ReadArgs(lim, store.ReadPos{Cursor: cursor, Frontier: cursor, Watch: []int64{max(cursor-5, 1)}})
		read = explain(`EXECUTE rd($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)`, args...)
		complete = explain(`EXECUTE cp($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`, fence.Lock, fence.Token, fence.Owner,
			[]int64{cursor + 1}, []int64{}, []string{}, []int64{}, []bool{}, []time.Time{done(t, st, cursor+1)[0].CreatedAt}, []time.Time{},
			[]string{}, []int64{})
		save = explain(`EXECUTE sc($1, $2, $3, $4, $5, $6, $7)`, fence.Lock, fence.Token, fence.Owner, cursor, epoch, cursor, int64(0))
		stats = planBuffers(t, explainUndoneJSONWith(t, conn, store.StatsSettings, `EXECUTE st(NULL)`))
		return read, complete, save, stats
	}
	read0, complete0, save0, stats0 := measure()

	// A report's snapshot, held while 200k rows are written and delivered:
	// most in one statement, and 2,000 batches written as the relay writes
	// them (a fenced statement each), with a cursor saved every 100. Each
	// save leaves one dead version of the cursor row (a few buffers per
	// thousand saves, at most one save a second), which is not what this
	// test looks for.
	holdSnapshot(t, st)
	history := 200_000
	if n, err := strconv.Atoi(os.Getenv("OUTBOXD_TEST_HISTORY_ROWS")); err == nil && n > 2000 {
		history = n // docs/testing.md: the same probe behind 1M or 10M rows
	}
	exec(t, st, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'deal', (i % 1000)::text, 'deal.happened', '{}' FROM generate_series(1, $1::int) i`, history)
	exec(t, st, `UPDATE outbox SET dispatched_at = now() WHERE dispatched_at IS NULL AND id <= $1 - 2000`, maxID(t, st))
	top := maxID(t, st)
	for id := top - 2000 + 1; id <= top; id++ {
		if _, _, err := counts(st.ReadPath().Complete(ctx, fence, store.Outcomes{Delivered: done(t, st, id)})); err != nil {
			t.Fatal(err)
		}
		if id%100 == 0 { // the relay saves at most once a second, past many batches
			if err := st.ReadPath().SaveCursor(ctx, fence, store.Cursor{At: id, Sent: id, Epoch: epoch}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := st.ReadPath().SaveCursor(ctx, fence, store.Cursor{At: top, Sent: top, Epoch: epoch}); err != nil {
		t.Fatal(err)
	}
	read1, complete1, save1, stats1 := measure()

	// flat fails a statement that touched more than 1.5× + 10 the buffers
	// it touched on the empty table.
	flat := func(when string, read, complete, save, stats int64) {
		t.Helper()
		t.Logf("shared buffers, empty table → behind %d rows delivered under a held snapshot (%s): read %d → %d, complete %d → %d, save cursor %d → %d, stats (each scrape) %d → %d",
			history, when, read0, read, complete0, complete, save0, save, stats0, stats)
		for _, c := range []struct {
			what          string
			before, after int64
		}{{"the read", read0, read}, {"the batch's fenced write", complete0, complete}, {"the cursor save", save0, save}, {"the backlog stats", stats0, stats}} {
			if c.after > c.before+c.before/2+10 {
				t.Errorf("%s touched %d buffers behind the history (%s), %d on an empty table: it walks what was delivered", c.what, c.after, when, c.before)
			}
		}
	}
	flat("never analyzed", read1, complete1, save1, stats1)

	// Then what autovacuum does (it is on in production), at its two worst
	// moments. ANALYZE while the relay lags (a backlog pending: the planner
	// learns that few rows are pending and that ids follow the heap, so a
	// walk of a whole pending index looks cheap), or while it is caught up
	// (nothing pending: every pending index looks one row long); each
	// followed by VACUUM, which can remove nothing the snapshot may see and
	// records the sizes. Both invalidate the prepared statements' plans:
	// they are made again from those figures.
	regimes := []struct {
		name  string
		setup func()
	}{
		{"analyzed and vacuumed caught up", func() {
			exec(t, st, `UPDATE outbox SET dispatched_at = now() WHERE dispatched_at IS NULL`)
			exec(t, st, `ANALYZE outbox`)
			exec(t, st, `VACUUM outbox`)
		}},
		{"analyzed while a backlog was pending, then vacuumed", func() {
			exec(t, st, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
				SELECT 'deal', (i % 1000)::text, 'deal.happened', '{}' FROM generate_series(1, $1::int) i`, history/12)
			exec(t, st, `ANALYZE outbox`)
			exec(t, st, `UPDATE outbox SET dispatched_at = now() WHERE dispatched_at IS NULL`)
			exec(t, st, `VACUUM outbox`)
		}},
	}
	for _, r := range regimes {
		r.setup()
		if err := st.ReadPath().SaveCursor(ctx, fence, store.Cursor{At: maxID(t, st), Sent: maxID(t, st), Epoch: epoch}); err != nil {
			t.Fatal(err)
		}
		read2, complete2, save2, stats2 := measure()
		flat(r.name, read2, complete2, save2, stats2)
	}
}

// Stats counts from the saved cursor on (below it every row is delivered,
// dead or backing off), and counts the same as a walk of every row: a row
// backing off below the cursor is pending, and the oldest; one backing off
// above it is pending once (the rows backing off are counted below the
// cursor only: counted wherever they are, one would be counted twice).
func TestStatsCountsFromTheCursor(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	fence := store.Fence{Lock: "lock:outbox:poller", Token: 1, Owner: "a"}
	enqueue(t, st, ev("deal", "A", 1))
	exec(t, st, `UPDATE outbox SET created_at = now() - interval '1 hour', available_at = now() - interval '1 hour'`)
	enqueue(t, st, ev("deal", "A", 2), ev("deal", "B", 3), ev("deal", "C", 4), ev("deal", "D", 5))
	first := maxID(t, st) - 4
	if _, _, err := counts(st.ReadPath().Complete(ctx, fence, store.Outcomes{Delivered: done(t, st, first+1, first+3), Failures: []store.Failure{{ID: first, Error: "x", Delay: time.Hour},
		{ID: first + 4, Error: "x", Delay: time.Hour}}})); err != nil {
		t.Fatal(err)
	}
	exec(t, st, `UPDATE outbox SET dead_at = now() WHERE id = $1`, first+2)
	_, _, _, epoch, err := cursorOf(st.ReadPath().LoadCursor(ctx, fence.Lock))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.ReadPath().SaveCursor(ctx, fence, store.Cursor{At: first + 3, Sent: first + 3, Epoch: epoch}); err != nil {
		t.Fatal(err)
	}
	got, err := st.Ops().Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Pending: the first row (backing off, below the cursor) and the last
	// (backing off, above it).
	if got.Pending != 2 || got.Dead != 1 || got.OldestPendingAge < 3000 {
		t.Fatalf("stats %+v; want 2 pending, 1 dead, the oldest an hour old", got)
	}
}

// The backlog count reads outbox_pending_idx alone above the cursor, as in
// a drain: 20,000 rows pending after VACUUM (their pages all-visible),
// 10,000 delivered above the saved cursor, counted right, in a few
// hundred buffers (the index's pages), not a buffer per heap page or per
// row, as a walk of the primary key (which reads every row above the
// cursor in the heap) would. Its own server: on the shared one, other
// tests' transactions keep VACUUM from marking the pages all-visible and
// the delivered rows' entries from being marked dead, which is what the
// test is not about.
func TestBacklogCountReadsThePendingIndexAlone(t *testing.T) {
	t.Parallel()
	st := privateStore(t)
	ctx := context.Background()
	fence := store.Fence{Lock: "lock:outbox:poller", Token: 1, Owner: "a"}
	if err := st.ClaimFence(ctx, fence); err != nil {
		t.Fatal(err)
	}
	exec(t, st, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'deal', (i % 1000)::text, 'deal.funded', jsonb_build_object('seq', i, 'pad', repeat('x', 170))
		FROM generate_series(1, 30000) i`)
	exec(t, st, `VACUUM ANALYZE outbox`)
	_, _, _, epoch, err := cursorOf(st.ReadPath().LoadCursor(ctx, fence.Lock))
	if err != nil {
		t.Fatal(err)
	}
	cursor := maxID(t, st) - 30000
	if err := st.ReadPath().SaveCursor(ctx, fence, store.Cursor{At: cursor, Sent: cursor, Epoch: epoch}); err != nil {
		t.Fatal(err)
	}
	exec(t, st, `UPDATE outbox SET dispatched_at = now() WHERE id <= $1`, cursor+10000)
	conn, err := st.Pool().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Conn().Prepare(ctx, "st", store.StatsSQL); err != nil {
		t.Fatal(err)
	}
	// The first scrape looks at the delivered rows' heap once.
	explainUndoneJSONWith(t, conn, store.StatsSettings, `EXECUTE st(NULL)`)
	buffers := planBuffers(t, explainUndoneJSONWith(t, conn, store.StatsSettings, `EXECUTE st(NULL)`))
	got, err := st.Ops().Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("20,000 pending, 10,000 delivered above the cursor: %d buffers a scrape", buffers)
	if got.Pending != 20000 {
		t.Fatalf("stats %+v, want 20000 pending", got)
	}
	if buffers > 300 {
		t.Errorf("the backlog count touched %d buffers for 20,000 pending rows, want at most 300: it reads rows, not the pending index", buffers)
	}
}

// preparedRead is a connection of st's pool, released at cleanup, on which
// readSQL is prepared as "rd" (generic: the relay's plan_cache_mode).
func preparedRead(t *testing.T, st *store.Store) *pgxpool.Conn {
	t.Helper()
	ctx := context.Background()
	conn, err := st.Pool().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Release)
	if _, err := conn.Conn().Prepare(ctx, "rd", store.ReadSQL); err != nil {
		t.Fatal(err)
	}
	return conn
}

// explainRead is the plan of one execution of conn's prepared read
// (preparedRead) with lim and pos: EXPLAIN (ANALYZE, BUFFERS), undone.
func explainRead(t *testing.T, conn *pgxpool.Conn, lim store.FetchLimits, pos store.ReadPos) costNode {
	t.Helper()
	args, _ := store.ReadArgs(lim, pos)
	raw := explainUndoneJSON(t, conn, `EXECUTE rd($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)`, args...)
	var plans []struct {
		Plan costNode `json:"Plan"`
	}
	if err := json.Unmarshal(raw, &plans); err != nil || len(plans) != 1 {
		t.Fatalf("explain: %v %s", err, raw)
	}
	return plans[0].Plan
}

// storeWithRows is a store with n pending rows over aggregates aggregates
// of type deal (round robin), empty payloads; base is the id before the
// first.
func storeWithRows(t *testing.T, n, aggregates int) (st *store.Store, base int64) {
	t.Helper()
	st, _ = testenv.Store(t)
	exec(t, st, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'deal', (i % $2)::text, 'deal.funded', '{}' FROM generate_series(1, $1) i`, n, aggregates)
	return st, maxID(t, st) - int64(n)
}

// outputNode is a node of EXPLAIN (VERBOSE, FORMAT JSON): what it outputs.
type outputNode struct {
	Type     string       `json:"Node Type"`
	Subplan  string       `json:"Subplan Name"`
	Relation string       `json:"Relation Name"`
	Alias    string       `json:"Alias"`
	Output   []string     `json:"Output"`
	Children []outputNode `json:"Plans"`
}

// explainReadVerbose is the plan conn's prepared read (preparedRead)
// would run with lim and pos, its nodes' outputs named (not executed).
func explainReadVerbose(t *testing.T, conn *pgxpool.Conn, lim store.FetchLimits, pos store.ReadPos) outputNode {
	t.Helper()
	args, _ := store.ReadArgs(lim, pos)
	args = append([]any{pgx.QueryExecModeSimpleProtocol}, args...)
	var raw []byte
	if err := conn.QueryRow(context.Background(), `EXPLAIN (VERBOSE, FORMAT JSON) EXECUTE rd($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)`, args...).Scan(&raw); err != nil {
		t.Fatal(err)
	}
	var plans []struct {
		Plan outputNode `json:"Plan"`
	}
	if err := json.Unmarshal(raw, &plans); err != nil || len(plans) != 1 {
		t.Fatalf("explain: %v %s", err, raw)
	}
	return plans[0].Plan
}
