package poller

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxd/outboxd/internal/testkit"
	"github.com/outboxd/outboxd/store"
)

// merge must keep a run still holding apart from an adjacent run given up:
// joined, the holding ids would be given up with the other run (rows above
// them sent while their transaction may still commit), or the given-up ids
// held again. Such neighbours arise across a read's span bound; the
// end-to-end case needs over 10,000 gaps and a read timed between the two
// give-ups, so the rule is checked here, on what the next read holds.
func TestMergeKeepsAHoldingRunApartFromAGivenUpOne(t *testing.T) {
	now := time.Now()
	for _, holdingBelow := range []bool{true, false} {
		holding := gapState{horizon: 7, seen: now}
		givenUp := gapState{horizon: 5, seen: now.Add(-time.Minute), givenUp: true}
		lower, upper := holding, givenUp
		if !holdingBelow {
			lower, upper = givenUp, holding
		}
		w := &gapWatch{runs: gapSet{{lo: 10, hi: 19, gapState: lower}, {lo: 20, hi: 29, gapState: upper}}}
		w.runs.merge()
		var pos store.ReadPos
		w.watch(&pos, now, time.Second)
		var held []int64
		for _, g := range pos.Holding {
			held = append(held, g.ID)
		}
		want := idRange(10, 19)
		if !holdingBelow {
			want = idRange(20, 29)
		}
		if !slices.Equal(held, want) {
			where := "above"
			if holdingBelow {
				where = "below"
			}
			t.Errorf("a holding run %s a given-up one: after merge the read holds ids %v, want %v (%d runs)", where, held, want, len(w.runs))
		}
	}

	// Two adjacent runs holding are one run, held as long as either would be.
	s := gapSet{
		{lo: 10, hi: 19, gapState: gapState{horizon: 7, seen: now.Add(-time.Second)}},
		{lo: 20, hi: 29, gapState: gapState{horizon: 9, seen: now}},
	}
	s.merge()
	if len(s) != 1 || s[0].lo != 10 || s[0].hi != 29 || s[0].horizon != 9 || !s[0].seen.Equal(now) {
		t.Fatalf("two adjacent holding runs after merge: %+v, want one run 10-29 with horizon 9 and the later first-missed time", s)
	}
}

func idRange(lo, hi int64) []int64 {
	var out []int64
	for id := lo; id <= hi; id++ {
		out = append(out, id)
	}
	return out
}

// A rolled-back gap settles as soon as its transaction ends, long before
// gap_wait. Its own server: the snapshot rule waits for every transaction
// in the cluster, and the shared server has other tests' open.
func TestRolledBackGapSettlesWithoutWaiting(t *testing.T) {
	e := setup(t)
	e.privatePostgres()
	ctx := context.Background()
	cfg := testConfig()
	cfg.GapWait = time.Hour
	r, logs := e.loggedRunner(cfg)
	e.run(r)
	lower := e.race("A")
	higher := e.produce("A")
	logs.WaitLines(t, 10*time.Second, "the gap seen", 1, func(l string) bool {
		return strings.Contains(l, `"msg":"waiting for an earlier id"`) && strings.Contains(l, `"outbox_id":`+itoa(lower.id))
	})
	if e.delivered(higher) {
		t.Fatal("the row above the open gap was delivered")
	}
	if err := lower.tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	e.waitFor("the row above the rolled-back gap delivered", 20*time.Second, func() bool { return e.delivered(higher) })
	if testutil.ToFloat64(r.m.GapsGivenUp) != 0 {
		t.Fatal("the gap was given up instead of settled")
	}
}

// One producer transaction that inserts many rows and stays open (a bulk
// load) while others commit leaves that many consecutive gaps. They are
// kept as runs (gaps.go): a read looks up at most maxWatchPerRead of them
// (plus the old ones' turns), however many there are, while every
// guarantee holds: the cursor is saved below them, and when the
// transaction commits its rows are delivered and the one whose aggregate
// went on first is warned and counted as a late commit. Kept one per id,
// each read looked up all 20,000 while they held, and the term kept a map
// entry per id.
func TestBulkTransactionGapsAreBounded(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	cfg := testConfig()
	cfg.BatchSize = 500 // the bulk drains in fewer batches
	r, logs := e.oneTerm(cfg)

	const bulk = 20_000
	if maxWatchPerRead+watchOldPerRead >= bulk/2 {
		t.Fatalf("maxWatchPerRead %d: the test's premise is a bulk well above it", maxWatchPerRead)
	}
	tx, err := e.st.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'deal', CASE WHEN g = 1 THEN 'A' ELSE 'b' || (g % 50) END, 'deal.funded', '{}'
		FROM generate_series(1, $1::int) g ORDER BY g`, bulk); err != nil {
		t.Fatal(err)
	}
	var lo, hi, lowA int64
	var warm int64 // the warm-up row: the highest id visible outside the bulk's transaction
	if err := e.st.Pool().QueryRow(ctx, `SELECT max(id) FROM outbox`).Scan(&warm); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, `SELECT min(id), max(id), min(id) FILTER (WHERE aggregate_id = 'A') FROM outbox WHERE id > $1`, warm).
		Scan(&lo, &hi, &lowA); err != nil {
		t.Fatal(err)
	}
	if hi-lo+1 != bulk {
		t.Fatalf("the bulk took ids %d..%d, want %d consecutive", lo, hi, bulk)
	}
	higher := e.produce("A")
	e.waitFor("the row above the bulk delivered past gap_wait", time.Minute, func() bool { return e.delivered(higher) })
	// The gaps grow old (given up over watchRecent ago) while rows flow.
	for end := time.Now().Add(cfg.GapWait + watchRecent + 500*time.Millisecond); time.Now().Before(end); {
		e.produce("other")
		time.Sleep(50 * time.Millisecond)
	}
	e.waitFor("the cursor saved past the row above", 20*time.Second, func() bool { return e.savedSent() >= higher })
	if c := e.savedCursor(); c >= lo {
		t.Fatalf("saved cursor %d while the bulk's ids from %d may still commit: want it below", c, lo)
	}
	if n := r.gapRuns.Load(); n != 1 {
		t.Fatalf("%d runs of gaps kept for one transaction's %d consecutive ids, want 1", n, bulk)
	}
	bound := int64(maxWatchPerRead + watchOldPerRead + 2)
	if n := r.watchedMost.Load(); n > bound {
		t.Fatalf("a read looked up %d gap ids behind one open transaction of %d rows, want at most %d", n, bulk, bound)
	}

	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	committed := time.Now()
	e.waitFor("every row of the bulk delivered", 4*time.Minute, func() bool {
		var n int
		if err := e.st.Pool().QueryRow(ctx, `SELECT count(*) FROM outbox WHERE id BETWEEN $1 AND $2 AND dispatched_at IS NOT NULL`, lo, hi).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n < bulk && time.Since(committed) > 90*time.Second {
			var lo2, hi2 int64
			_ = e.st.Pool().QueryRow(ctx, `SELECT min(id), max(id) FROM outbox WHERE dispatched_at IS NULL`).Scan(&lo2, &hi2)
			t.Logf("DEBUG delivered %d of %d, pending %d..%d, gap runs %d", n, bulk, lo2, hi2, r.gapRuns.Load())
		}
		return n == bulk
	})
	if n := r.watchedMost.Load(); n > bound {
		t.Fatalf("a read looked up %d gap ids once the bulk committed, want at most %d", n, bound)
	}
	expectLateCommit(t, logs, r, lowA, higher)
}

// Gaps given up long ago while their transactions still run are looked up
// in turns: about watchOldPerRead of them per read, each one once every k
// reads; the rest (holding, recently given up, transactions ended) by
// every read. Looked up all on every read, a read behind one long open
// transaction cost a primary-key probe per rolled-back id since it began.
func TestOldGivenUpGapsAreLookedUpInTurns(t *testing.T) {
	now := time.Now()
	gapWait := 200 * time.Millisecond
	r := &reader{}
	const old = 1000
	// Ids three apart (coprime to k): each a run of its own, as gaps
	// between committed rows.
	for id := int64(3); id <= 3*old; id += 3 {
		r.gaps.runs = append(r.gaps.runs, gapRun{lo: id, hi: id, gapState: gapState{seen: now.Add(-time.Minute), givenUp: true}})
	}
	always := map[int64]gapState{
		4001: {seen: now},                                              // holding
		4003: {seen: now.Add(-gapWait), givenUp: true},                 // given up just now
		4005: {seen: now.Add(-time.Minute), givenUp: true, ended: now}, // transactions ended: lateWatch
	}
	for _, id := range []int64{4001, 4003, 4005} {
		r.gaps.runs = append(r.gaps.runs, gapRun{lo: id, hi: id, gapState: always[id]})
	}
	k := (old + watchOldPerRead - 1) / watchOldPerRead
	seen := map[int64]int{}
	for i := range k {
		var pos store.ReadPos
		r.gaps.watch(&pos, now, gapWait)
		w := pos.Watch
		if len(w) > watchOldPerRead+len(always) {
			t.Fatalf("read %d watched %d gaps, want at most %d of the %d old ones plus the %d others", i+1, len(w), watchOldPerRead, old, len(always))
		}
		for _, id := range w {
			seen[id]++
		}
	}
	for _, g := range r.gaps.runs {
		id := g.lo
		want := 1
		if _, ok := always[id]; ok {
			want = k
		}
		if seen[id] != want {
			t.Fatalf("gap %d looked up %d times in %d reads, want %d", id, seen[id], k, want)
		}
	}
}

// A late commit among many old gaps (each looked up only in its turn) is
// still delivered, warned and counted: a transaction elsewhere stays open
// throughout, so no gap can settle; one producer's stays open while 300
// others roll back, and commits after the later row of its aggregate went.
func TestLateCommitAmongManyOldGapsIsWarned(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	cfg := testConfig()
	r, logs := e.oneTerm(cfg)
	// A transaction with an xid held open elsewhere (a long writer, a
	// migration) keeps every gap from settling, the late one's included
	// after it commits.
	blocker, err := e.st.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = blocker.Rollback(ctx) }()
	if _, err := blocker.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
		t.Fatal(err)
	}
	lower := e.race("A")
	for range 300 {
		tx, err := e.st.Pool().Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Enqueue(ctx, tx, event("rolled-back")); err != nil {
			t.Fatal(err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
	higher := e.produce("A")
	e.waitFor("the higher id delivered past gap_wait", time.Minute, func() bool { return e.delivered(higher) })
	// The gaps grow old (given up over watchRecent ago), then the lower
	// id commits: found in its turn among 301 old gaps.
	time.Sleep(cfg.GapWait + watchRecent + 500*time.Millisecond)
	lower.commit(t)
	e.waitFor("the late row delivered", time.Minute, func() bool { return e.delivered(lower.id) })
	if n := logs.Count(`"msg":"lock acquired"`); n != 1 {
		t.Fatalf("%d terms, want one (the test's premise); last lines:\n%s", n, logs.Tail(20))
	}
	expectLateCommit(t, logs, r, lower.id, higher)
}

// A run of gaps still holding is looked up maxWatchPerRead ids a read
// from its lowest; the first id not looked up is passed as a holding gap
// all the same (watch, the marker), so the hold stays below it. Here two
// open transactions leave one run: the first holds exactly the ids a read
// looks up, the second the next ones, with rows of aggregate X, and a row
// of X is committed above. When the first commits, every id looked up is
// visible: without the marker that read released the row above, and X's
// later row went before the second transaction's rows of X.
func TestHoldingRunBeyondTheWatchBudgetStillHolds(t *testing.T) {
	e := setup(t)
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

// oneTerm runs a logged runner with a gap_wait of 100 ms for one term
// (the tests count its warnings) and waits until it delivers.
func (e *testBundle) oneTerm(cfg testCfg) (*runner, *testkit.Logs) {
	cfg.GapWait = 100 * time.Millisecond
	cfg.LockTTL = 30 * time.Second
	r, logs := e.loggedRunner(cfg)
	e.run(r)
	warm := e.produce("warm")
	e.waitFor("the runner delivering", time.Minute, func() bool { return e.delivered(warm) })
	return r, logs
}
