package store_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/store"
)

// Read decodes a row in few allocations: its payload, its aggregate id and
// not much more. The aggregate and event types, mostly the same from row to
// row, are not made again per row, and the scan's destinations are not
// rebuilt per row (each was an allocation a row). Skip goes as one string,
// not an allocation per id.
func TestReadAllocatesLittlePerRow(t *testing.T) {
	st, _ := testenv.Store(t)
	ctx := context.Background()
	var evs []store.Event
	for i := range 1000 {
		evs = append(evs, ev("deal", fmt.Sprint(i%10), i))
	}
	if err := enqueueB(st, evs...); err != nil {
		t.Fatal(err)
	}
	skip := make([]int64, 3000) // rows in flight elsewhere: none of these
	for i := range skip {
		skip[i] = int64(1_000_000 + i)
	}
	lim := store.FetchLimits{Rows: 1000, RowBytes: 1 << 20, Bytes: 64 << 20, Skip: skip}
	n := testing.AllocsPerRun(3, func() {
		if res, err := st.ReadPath().Read(ctx, lim, store.ReadPos{}); err != nil || len(res.Rows) != 1000 {
			t.Fatal(len(res.Rows), err)
		}
	})
	t.Logf("%.0f allocations per read of 1,000 rows", n)
	if perRow := n / 1000; perRow > 3 {
		t.Errorf("%.1f allocations per row read, want at most 3", perRow)
	}
}

// A read's rows take room for the rows it finds, not for its limit: while
// events stream a read finds a few rows, and room for poller.batch_size of
// them made per read would be most of what the relay allocates. In a drain, where every read fills the limit, the room is
// made once per read at its full size, not grown row by row.
func TestReadAllocatesForTheRowsItFinds(t *testing.T) {
	st, _ := testenv.Store(t)
	ctx := context.Background()
	if err := enqueueB(st, ev("deal", "1", 1), ev("deal", "2", 2), ev("deal", "3", 3)); err != nil {
		t.Fatal(err)
	}
	lim := store.FetchLimits{Rows: 1000, RowBytes: 1 << 20, Bytes: 64 << 20}
	read := func() store.ReadResult {
		res, err := st.ReadPath().Read(ctx, lim, store.ReadPos{})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	const reads = 50
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range reads {
		if res := read(); len(res.Rows) != 3 {
			t.Fatalf("read %d rows, want 3", len(res.Rows))
		}
	}
	runtime.ReadMemStats(&after)
	perRead := (after.TotalAlloc - before.TotalAlloc) / reads
	t.Logf("%d bytes allocated per read of 3 rows (limit 1,000)", perRead)
	if room := uint64(1000 * unsafe.Sizeof(store.Row{})); perRead >= room/4 {
		t.Errorf("a read of 3 rows allocated %d bytes, a quarter or more of room for its limit of 1,000 rows (%d bytes)", perRead, room)
	}

	var evs []store.Event
	for i := range 1000 {
		evs = append(evs, ev("deal", fmt.Sprint(i%10), i))
	}
	if err := enqueueB(st, evs...); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if res := read(); len(res.Rows) != 1000 || (i == 1 && cap(res.Rows) != 1000) {
			t.Fatalf("read %d: %d rows in room for %d, want 1,000 in room for 1,000 after a read of 1,000", i+1, len(res.Rows), cap(res.Rows))
		}
	}
}

// The read never walks what was delivered before its cursor, even when a
// snapshot held elsewhere keeps vacuum from removing a single index entry:
// its buffer count stays flat across 200k rows delivered under that
// snapshot, where the stateless scan's (FetchDue) grows.
func TestReadCostDoesNotGrowWithHistory(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	lim := store.FetchLimits{Rows: 100, RowBytes: 1 << 20, Bytes: 16 << 20}
	stateless := func() int64 {
		return buffers(t, st, store.FetchDueSQL, lim.Rows, lim.RowBytes, lim.Bytes, []int64{}, []string{}, []string{})
	}
	// A watched gap and a parked aggregate, so every part of the read runs.
	read := func(cursor int64) int64 {
		args, _ := store.ReadArgs(lim, store.ReadPos{Cursor: cursor, Frontier: cursor, Watch: []int64{cursor - 5},
			Parked: []store.Parked{{Aggregate: store.Aggregate{Type: "deal", ID: "7"}, MinID: cursor - 5}}})
		return buffers(t, st, store.ReadSQL, args...)
	}
	deliverAll := func() {
		exec(t, st, `UPDATE outbox SET dispatched_at = now() WHERE dispatched_at IS NULL`)
	}
	pending := func() {
		var evs []store.Event
		for i := range 10 {
			evs = append(evs, ev("deal", string(rune('a'+i)), i))
		}
		enqueue(t, st, evs...)
	}

	c0 := maxID(t, st)
	pending()
	readBefore, statelessBefore := read(c0), stateless()
	deliverAll()

	// A report's snapshot, held while 200k rows are written and delivered.
	holder, err := st.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(ctx) }()
	if _, err := holder.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ`); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, `SELECT count(*) FROM outbox_fence`); err != nil {
		t.Fatal(err)
	}
	exec(t, st, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'deal', (i % 1000)::text, 'deal.happened', '{}' FROM generate_series(1, 200000) i`)
	deliverAll()
	c1 := maxID(t, st)
	pending()
	readAfter, statelessAfter := read(c1), stateless()

	t.Logf("shared buffers: read %d -> %d, stateless fetch %d -> %d", readBefore, readAfter, statelessBefore, statelessAfter)
	if readAfter > 2*readBefore+10 {
		args, _ := store.ReadArgs(lim, store.ReadPos{Cursor: c1, Frontier: c1, Watch: []int64{c1 - 5},
			Parked: []store.Parked{{Aggregate: store.Aggregate{Type: "deal", ID: "7"}, MinID: c1 - 5}}})
		rows, _ := st.Pool().Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+store.ReadSQL, args...)
		plan, _ := pgx.CollectRows(rows, pgx.RowTo[string])
		t.Log(strings.Join(plan, "\n"))
		t.Errorf("the read touched %d buffers behind 200k delivered rows, %d before: it walks history", readAfter, readBefore)
	}
	if statelessAfter < 10*statelessBefore {
		t.Errorf("the stateless fetch touched %d buffers, %d before: the test shows no history to walk", statelessAfter, statelessBefore)
	}
}

// A row read above an id that is not visible (a producer that took it
// earlier and has not committed) is held while that id may still commit;
// a rollback settles the gap once its transaction ended (snapshot xmin),
// and a commit lets both go, in id order. Its own server: the snapshot
// rule waits for every transaction of the cluster, and the shared one has
// other tests' transactions open.
func TestReadHoldsRowsAboveAGap(t *testing.T) {
	t.Parallel()
	st := privateStore(t)
	ctx := context.Background()
	lim := store.FetchLimits{Rows: 10}

	for _, commit := range []bool{true, false} {
		base := maxID(t, st)
		pos := store.ReadPos{Cursor: base, Frontier: base}
		slow, err := st.Pool().Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Enqueue(ctx, slow, ev("deal", "A", 1)); err != nil {
			t.Fatal(err)
		}
		enqueue(t, st, ev("deal", "A", 2)) // commits first, with the higher id
		gap, above := base+1, base+2

		res, err := st.ReadPath().Read(ctx, lim, pos)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Rows) != 0 || len(res.NewGaps) != 1 || res.NewGaps[0] != gap ||
			len(res.Hot) != 1 || res.Hot[0].ID != above || res.Hot[0].State != store.HotHeld {
			t.Fatalf("first read: rows %+v gaps %v hot %+v; want %d held behind gap %d", res.Rows, res.NewGaps, res.Hot, above, gap)
		}
		pos.Frontier = res.Classified
		pos.Holding = []store.Gap{{ID: gap, Horizon: res.XMax}}
		pos.Watch = []int64{gap}
		if res, _ := st.ReadPath().Read(ctx, lim, pos); len(res.Rows) != 0 {
			t.Fatalf("rows %+v returned while the gap may still commit", res.Rows)
		}

		if commit {
			if err := slow.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		} else if err := slow.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		res, err = st.ReadPath().Read(ctx, lim, pos)
		if err != nil {
			t.Fatal(err)
		}
		want := []int64{above}
		if commit {
			want = []int64{gap, above}
		}
		if len(res.Rows) != len(want) || res.Rows[0].ID != want[0] || res.Rows[len(res.Rows)-1].ID != above {
			t.Fatalf("commit=%v: rows %+v after the gap's transaction ended, want ids %v", commit, res.Rows, want)
		}
		if !commit && res.XMin < pos.Holding[0].Horizon {
			t.Fatalf("xmin %d below the horizon %d after the rollback", res.XMin, pos.Holding[0].Horizon)
		}
		exec(t, st, `UPDATE outbox SET dispatched_at = now() WHERE dispatched_at IS NULL`)
	}
}

// Rows that re-enter the pending set below the cursor are found: a replayed
// dead row through the delayed index (ReplayDead makes it due now), a row
// an operator marked undelivered by hand through the rescan
// (PendingBetween) and its parked aggregate.
func TestReadFindsRowsBelowTheCursor(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	enqueue(t, st, ev("deal", "dead", 1), ev("deal", "edited", 2), ev("deal", "other", 3))
	dead, edited := maxID(t, st)-2, maxID(t, st)-1
	exec(t, st, `UPDATE outbox SET dispatched_at = now() WHERE dispatched_at IS NULL`)
	exec(t, st, `UPDATE outbox SET dispatched_at = NULL, dead_at = now() WHERE id = `+strconv.FormatInt(dead, 10))
	cursor := maxID(t, st)
	lim := store.FetchLimits{Rows: 10}
	pos := store.ReadPos{Cursor: cursor, Frontier: cursor}
	if res, err := st.ReadPath().Read(ctx, lim, pos); err != nil || len(res.Rows) != 0 {
		t.Fatalf("rows %+v, %v before anything re-entered", res.Rows, err)
	}

	if n, err := st.Reconcile().ReplayDead(ctx, replayFence, store.Replay{Filter: store.ReplayFilter{IDs: []int64{dead}}, BatchSize: 10, Progress: nil}); err != nil || n != 1 {
		t.Fatalf("replay: %d, %v", n, err)
	}
	res, err := st.ReadPath().Read(ctx, lim, pos)
	if err != nil || len(res.Rows) != 1 || res.Rows[0].ID != dead {
		t.Fatalf("after replay: rows %+v, %v; want the replayed row %d", res.Rows, err, dead)
	}
	exec(t, st, `UPDATE outbox SET dispatched_at = now() WHERE id = `+strconv.FormatInt(dead, 10))

	exec(t, st, `UPDATE outbox SET dispatched_at = NULL WHERE id = `+strconv.FormatInt(edited, 10))
	if res, _ := st.ReadPath().Read(ctx, lim, pos); len(res.Rows) != 0 {
		t.Fatalf("rows %+v: a hand-edited row below the cursor needs the rescan to be found", res.Rows)
	}
	found, err := st.ReadPath().PendingBetween(ctx, 0, cursor)
	if err != nil || len(found) != 1 || found[0].MinID != edited || found[0].ID != "edited" {
		t.Fatalf("rescan found %+v, %v; want aggregate deal/edited from %d", found, err, edited)
	}
	pos.Parked = found
	res, err = st.ReadPath().Read(ctx, lim, pos)
	if err != nil || len(res.Rows) != 1 || res.Rows[0].ID != edited || res.Parked[found[0].Aggregate] != edited {
		t.Fatalf("parked: rows %+v parked %v, %v; want %d", res.Rows, res.Parked, err, edited)
	}
	exec(t, st, `UPDATE outbox SET dispatched_at = now() WHERE id = `+strconv.FormatInt(edited, 10))
	if res, _ := st.ReadPath().Read(ctx, lim, pos); len(res.Rows) != 0 || res.Parked[found[0].Aggregate] != 0 {
		t.Fatalf("after delivery: rows %+v parked %v; want none and the aggregate released", res.Rows, res.Parked)
	}
}

// An available_at no retry could mean (infinity, or more than 100 years
// ahead) would block its aggregate for ever: the row comes back as poison,
// unloaded.
func TestFarAvailableAtIsPoison(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	exec(t, st, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, available_at)
		VALUES ('deal', '1', 'e', '{"x":1}', 'infinity'), ('deal', '2', 'e', '{"x":2}', now() + interval '200 years'),
		       ('deal', '3', 'e', '{"x":3}', now() + interval '1 hour')`)
	res, err := st.ReadPath().Read(ctx, store.FetchLimits{Rows: 10}, store.ReadPos{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 2 || res.Rows[0].Poison == "" || res.Rows[1].Poison == "" || res.Rows[0].Payload != nil {
		t.Fatalf("rows %+v: want the two far ones, poison and unloaded; the hour-away one waits", res.Rows)
	}
}

// Busy aggregates' rows are not returned, by the read or the stateless
// fetch; the read reports them passed (so the poller remembers them).
func TestBusyAggregatesAreLeftOut(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	enqueue(t, st, ev("deal", "A", 1), ev("deal", "B", 2), ev("deal", "A", 3), ev("deal", "C", 4))
	lim := store.FetchLimits{Rows: 10, Busy: []store.Aggregate{{Type: "deal", ID: "A"}}}
	res, err := st.ReadPath().Read(ctx, lim, store.ReadPos{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 2 || res.Rows[0].AggregateID == "A" || res.Rows[1].AggregateID == "A" {
		t.Fatalf("read rows %+v, want B's and C's only", res.Rows)
	}
	busy := 0
	for _, h := range res.Hot {
		if h.State == store.HotBusy && h.Aggregate.ID == "A" {
			busy++
		}
	}
	if busy != 2 {
		t.Fatalf("hot rows %+v, want A's two reported busy", res.Hot)
	}
	rows, err := st.ReadPath().FetchDue(ctx, lim)
	if err != nil || len(rows) != 2 || rows[0].AggregateID == "A" || rows[1].AggregateID == "A" {
		t.Fatalf("fetch due rows %+v, %v; want B's and C's only", rows, err)
	}
}

// A read whose hot rows fill the ids from the frontier on (a drain: no
// producer in flight, no rollback) does not look for holes among them:
// the count of hot ids in the span gates that pass, whose sort and window
// over the hot rows are a sizeable part of the read's time in a drain. A
// hole still makes it run and comes back as a new gap
// (TestReadHoldsRowsAboveAGap and the gap tests check what it finds).
func TestReadLooksForHolesOnlyWhenThereAreSome(t *testing.T) {
	t.Parallel()
	st, base := storeWithRows(t, 1000, 100)
	ctx := context.Background()
	conn := preparedRead(t, st)
	// holesRan says whether any node of the holes pass ran.
	holesRan := func(frontier int64) bool {
		t.Helper()
		plan := explainRead(t, conn, store.FetchLimits{Rows: 1000}, store.ReadPos{Cursor: frontier, Frontier: frontier})
		holes := plan.find("CTE holes")
		if holes == nil {
			t.Fatal("no CTE holes in the read's plan")
		}
		return holes.ran("WindowAgg")
	}
	if holesRan(base) {
		t.Error("the read looked for holes among 1,000 hot rows with consecutive ids")
	}
	exec(t, st, `DELETE FROM outbox WHERE id = $1`, base+500)
	if !holesRan(base) {
		t.Error("the read did not look for holes with id 500 of 1,000 missing")
	}
	res, err := st.ReadPath().Read(ctx, store.FetchLimits{Rows: 1000}, store.ReadPos{Cursor: base, Frontier: base})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.NewGaps) != 1 || res.NewGaps[0] != base+500 {
		t.Fatalf("new gaps %v, want [%d]", res.NewGaps, base+500)
	}
}

// TestReadLooksUpSkippedRowsInAHash: the rows in flight (FetchLimits.Skip,
// up to four batches of ids in a drain) are looked up per candidate in a
// hash, never compared one by one: "<> ALL ($11)" made each read of 1,000
// rows do 3 million comparisons, its largest CPU cost in a drain (docs/testing.md).
// The plan is the relay's: prepared, generic.
func TestReadLooksUpSkippedRowsInAHash(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	var evs []store.Event
	for i := range 20 {
		evs = append(evs, ev("deal", strconv.Itoa(i%4), i))
	}
	enqueue(t, st, evs...)
	conn, err := st.Pool().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Conn().Prepare(ctx, "rd", store.ReadSQL); err != nil {
		t.Fatal(err)
	}
	skip := make([]int64, 3000)
	for i := range skip {
		skip[i] = int64(i + 1)
	}
	args, _ := store.ReadArgs(store.FetchLimits{Rows: 1000, Skip: skip}, store.ReadPos{})
	args = append([]any{pgx.QueryExecModeSimpleProtocol}, args...)
	rows, err := conn.Query(ctx, `EXPLAIN EXECUTE rd($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)`, args...)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	// The candidates' filter (notdue, blocked) holds no array comparison:
	// the skipped ids are a hashed subplan beside it. (Parameter numbers do
	// not tell: InitPlans are numbered with the statement's own.)
	for _, l := range lines {
		if strings.Contains(l, "Filter:") && strings.Contains(l, "blocked") &&
			(strings.Contains(l, "ALL (") || strings.Contains(l, "ANY (")) {
			t.Fatalf("the read compares candidates with each skipped id: %s\n%s", l, strings.Join(lines, "\n"))
		}
	}
	// And it still leaves them out.
	res, err := st.ReadPath().Read(ctx, store.FetchLimits{Rows: 1000, Skip: []int64{1, 2, 5}}, store.ReadPos{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res.Rows {
		if r.ID == 1 || r.ID == 2 || r.ID == 5 {
			t.Fatalf("skipped row %d returned", r.ID)
		}
	}
	if len(res.Rows) != 17 {
		t.Fatalf("%d rows returned, want 17", len(res.Rows))
	}
}

// TestReadCutsItsBatchOnNarrowRows: the read chooses the rows it returns
// (the row and byte limits: a sort, a window, the CTE out) on their ids
// and sizes, and takes the payloads and headers from hot and low once the
// choice is made: carried through the cut they would be copied four more
// times per read. Rows from below the cursor come back in id order all
// the same (readSQL returns them after the hot ones; Read sorts them).
func TestReadCutsItsBatchOnNarrowRows(t *testing.T) {
	t.Parallel()
	st, base := storeWithRows(t, 20, 7)
	ctx := context.Background()
	cursor := base + 10
	exec(t, st, `UPDATE outbox SET dispatched_at = now() WHERE id <= $1 AND id <> $2`, cursor, base+3)
	// base+3 retried and due again: found below the cursor (low), not by the scan.
	exec(t, st, `UPDATE outbox SET attempts = 1, created_at = now() - interval '1 hour', available_at = now() - interval '1 minute' WHERE id = $1`, base+3)
	res, err := st.ReadPath().Read(ctx, store.FetchLimits{Rows: 100}, store.ReadPos{Cursor: cursor, Frontier: cursor})
	if err != nil {
		t.Fatal(err)
	}
	want := []int64{base + 3}
	for id := cursor + 1; id <= base+20; id++ {
		want = append(want, id)
	}
	var got []int64
	for _, r := range res.Rows {
		got = append(got, r.ID)
		if string(r.Payload) != "{}" {
			t.Fatalf("row %d payload %q", r.ID, r.Payload)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("rows %v, want %v (id order, the row below the cursor first)", got, want)
	}

	plan := explainReadVerbose(t, preparedRead(t, st), store.FetchLimits{Rows: 100}, store.ReadPos{Cursor: cursor, Frontier: cursor})
	var cut *outputNode
	var findCut func(n *outputNode)
	findCut = func(n *outputNode) {
		for i := range n.Children {
			if n.Children[i].Subplan == "CTE out" {
				cut = &n.Children[i]
			} else if cut == nil {
				findCut(&n.Children[i])
			}
		}
	}
	findCut(&plan)
	if cut == nil {
		t.Fatal("no CTE out in the read's plan")
	}
	// The nodes that copy the rows they pass (a scan of a CTE may list
	// every column of it, the tuples themselves, uncopied).
	stores := map[string]bool{"Sort": true, "Incremental Sort": true, "WindowAgg": true, "Materialize": true, "Hash": true}
	var wide func(n outputNode) string
	wide = func(n outputNode) string {
		for _, o := range n.Output {
			if (stores[n.Type] || n.Subplan == "CTE out") && (strings.Contains(o, "payload") || strings.Contains(o, "headers")) {
				return n.Type + ": " + o
			}
		}
		for _, c := range n.Children {
			if w := wide(c); w != "" {
				return w
			}
		}
		return ""
	}
	if w := wide(*cut); w != "" {
		t.Fatalf("the read's cut (CTE out) carries payloads or headers: %s", w)
	}
}

// TestReadLooksUpSkippedIDsOnlyAtOrBelowTheHighest: a candidate above
// every skipped id is not looked up among them, so in a drain, where the
// rows in flight lie at or below the cursor and every hot row above it,
// the hash of up to 3,000 skipped ids is not built at all. A skipped id
// among the hot rows is still left out.
func TestReadLooksUpSkippedIDsOnlyAtOrBelowTheHighest(t *testing.T) {
	t.Parallel()
	st, base := storeWithRows(t, 20, 7)
	ctx := context.Background()
	cursor := base + 10
	conn := preparedRead(t, st)
	// read says whether any lookup in the skipped ids (SELECT unnest($11),
	// a ProjectSet; Busy's is a Function Scan) ran, and returns the ids
	// read.
	read := func(skip []int64) (bool, []int64) {
		t.Helper()
		lim, pos := store.FetchLimits{Rows: 100, Skip: skip}, store.ReadPos{Cursor: cursor, Frontier: cursor}
		plan := explainRead(t, conn, lim, pos)
		res, err := st.ReadPath().Read(ctx, lim, pos)
		if err != nil {
			t.Fatal(err)
		}
		var ids []int64
		for _, r := range res.Rows {
			ids = append(ids, r.ID)
		}
		return plan.ran("ProjectSet"), ids
	}
	var inFlight []int64
	for id := base + 1; id <= cursor; id++ {
		inFlight = append(inFlight, id)
	}
	if looked, ids := read(inFlight); looked || len(ids) != 10 || ids[0] != cursor+1 {
		t.Fatalf("skipped ids all below the hot rows: looked up %v, rows %v; want no lookup and rows %d..%d", looked, ids, cursor+1, base+20)
	}
	looked, ids := read([]int64{base + 5, base + 15})
	if !looked || len(ids) != 9 || slices.Contains(ids, base+15) {
		t.Fatalf("skipped id %d among the hot rows: looked up %v, rows %v; want it looked up and left out", base+15, looked, ids)
	}
}

// TestReadComputesTheFarBoundOncePerRead: the rows the read scans are
// judged against now() + 100 years computed once per read (an InitPlan),
// not per row, where the interval would be added twice a row.
// TestFarAvailableAtIsPoison checks what the bound decides.
func TestReadComputesTheFarBoundOncePerRead(t *testing.T) {
	t.Parallel()
	st, base := storeWithRows(t, 20, 7)
	plan := explainReadVerbose(t, preparedRead(t, st), store.FetchLimits{Rows: 100}, store.ReadPos{Cursor: base, Frontier: base})
	scans := 0
	var walk func(n outputNode)
	walk = func(n outputNode) {
		if n.Relation == "outbox" && strings.HasPrefix(n.Alias, "o") {
			scans++
			for _, o := range n.Output {
				if strings.Contains(o, "100 years") {
					t.Errorf("scan of outbox %s computes the far bound per row: %s", n.Alias, o)
				}
			}
		}
		for _, c := range n.Children {
			walk(c)
		}
	}
	walk(plan)
	if scans == 0 {
		t.Fatal("no scan of outbox in the read's plan")
	}
}

// A due retry above the rows a short read scans (beyond its row limit,
// within what an earlier, longer read classified) is held by a gap below
// it like any other row (readSQL, lowids: "e.id < hold.h"): the gap's
// transaction may still commit a lower row of the retry's aggregate.
func TestReadHoldsADueRetryBeyondTheScannedRows(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	base := maxID(t, st)
	enqueue(t, st, ev("deal", "A", 1), ev("deal", "B", 2))
	slow, err := st.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = slow.Rollback(context.Background()) })
	if err := store.Enqueue(ctx, slow, ev("deal", "C", 3)); err != nil {
		t.Fatal(err)
	}
	enqueue(t, st, ev("deal", "C", 4))
	gap, retry := base+3, base+4
	exec(t, st, `UPDATE outbox SET attempts = 1, available_at = now() WHERE id = $1`, retry) // failed once, due again

	res, err := st.ReadPath().Read(ctx, store.FetchLimits{Rows: 10}, store.ReadPos{Cursor: base, Frontier: base})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.NewGaps) != 1 || res.NewGaps[0] != gap || res.Classified != retry {
		t.Fatalf("premise: the long read found gaps %v and classified up to %d; want gap %d, up to %d", res.NewGaps, res.Classified, gap, retry)
	}
	for _, row := range res.Rows {
		if row.ID >= gap {
			t.Fatalf("the long read returned row %d above the gap %d", row.ID, gap)
		}
	}
	// The next read is short (two rows, both still in flight): it scans
	// base+1 and base+2 only; the retry lies beyond, above the gap.
	short := store.FetchLimits{Rows: 2, Skip: []int64{base + 1, base + 2}}
	pos := store.ReadPos{Cursor: base, Frontier: res.Classified,
		Holding: []store.Gap{{ID: gap, Horizon: res.XMax}}, Watch: []int64{gap}}
	res, err = st.ReadPath().Read(ctx, short, pos)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 0 {
		t.Fatalf("the short read returned %+v while the gap %d below it may still commit", res.Rows, gap)
	}
}

// A dead-lettered row above the cursor is settled: the read neither
// returns it nor counts it among the pending rows it saw (readSQL, hot).
// A new holder whose saved cursor lies below one (held there by a gap or
// a parked row) would otherwise send it again without a replay.
func TestReadLeavesDeadRowsAboveTheCursorOut(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	base := maxID(t, st)
	enqueue(t, st, ev("deal", "A", 1), ev("deal", "B", 2))
	dead, live := base+1, base+2
	exec(t, st, `UPDATE outbox SET attempts = 25, last_error = 'gone', dead_at = now() WHERE id = $1`, dead)

	res, err := st.ReadPath().Read(ctx, store.FetchLimits{Rows: 10}, store.ReadPos{Cursor: base, Frontier: base})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 1 || res.Rows[0].ID != live {
		t.Fatalf("rows %+v, want only the live row %d (row %d is dead)", res.Rows, live, dead)
	}
	for _, h := range res.Hot {
		if h.ID == dead {
			t.Fatalf("the dead row %d read as pending (state %c)", dead, h.State)
		}
	}
}

// A due retry above the rows a read scans is not returned while a lower
// untried row of its aggregate, also beyond the scan, is pending (readSQL,
// lowids: its gap committed; a longer read sends the lower one first):
// otherwise the retry went ahead of it, out of its aggregate's order.
func TestReadKeepsADueRetryBehindALowerRowBeyondTheScan(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	base := maxID(t, st)
	enqueue(t, st, ev("deal", "A", 1), ev("deal", "B", 2), ev("deal", "C", 3), ev("deal", "C", 4))
	lower, retry := base+3, base+4
	exec(t, st, `UPDATE outbox SET attempts = 1, available_at = now() WHERE id = $1`, retry) // failed once, due again

	// Two rows in flight fill a short read: it scans base+1 and base+2
	// only; both rows of C lie beyond.
	short := store.FetchLimits{Rows: 2, Skip: []int64{base + 1, base + 2}}
	res, err := st.ReadPath().Read(ctx, short, store.ReadPos{Cursor: base, Frontier: retry})
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range res.Rows {
		if row.ID == retry {
			t.Fatalf("the short read returned the retry %d ahead of the pending row %d of its aggregate: %+v", retry, lower, res.Rows)
		}
	}
	// A full read returns both, in order.
	res, err = st.ReadPath().Read(ctx, store.FetchLimits{Rows: 10, Skip: []int64{base + 1, base + 2}}, store.ReadPos{Cursor: base, Frontier: retry})
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for _, row := range res.Rows {
		ids = append(ids, row.ID)
	}
	if len(ids) != 2 || ids[0] != lower || ids[1] != retry {
		t.Fatalf("the full read returned %v, want [%d %d]", ids, lower, retry)
	}
}

// A parked aggregate's rows below the cursor are looked up a batch at a
// time; the rows in flight (Skip) are not among them. Counted among them,
// they would push its next untried rows out of the lookup while its rows
// above the cursor are still taken: sent ahead of the rows they follow.
func TestReadTakesAParkedAggregatesRowsInOrderPastThoseInFlight(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	enqueue(t, st, ev("deal", "A", 1), ev("deal", "A", 2), ev("deal", "A", 3), ev("deal", "A", 4), ev("deal", "A", 5))
	cursor := maxID(t, st)
	enqueue(t, st, ev("deal", "A", 6))
	first := cursor - 4
	lim := store.FetchLimits{Rows: 3, Skip: []int64{first, first + 1}}
	pos := store.ReadPos{Cursor: cursor, Frontier: cursor,
		Parked: []store.Parked{{Aggregate: store.Aggregate{Type: "deal", ID: "A"}, MinID: first}}}
	res, err := st.ReadPath().Read(ctx, lim, pos)
	if err != nil {
		t.Fatal(err)
	}
	var got []int64
	for _, r := range res.Rows {
		got = append(got, r.ID)
	}
	if want := []int64{first + 2, first + 3, first + 4}; !slices.Equal(got, want) {
		t.Fatalf("rows %v, want %v: the aggregate's untried rows below the cursor, in order, before any above it", got, want)
	}
}
