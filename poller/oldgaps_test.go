package poller

import (
	"context"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testkit"
	"github.com/outboxd/outboxd/store"
)

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
	e := newEnv(t)
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

// oneTerm runs a logged runner with a gap_wait of 100 ms for one term
// (the tests count its warnings) and waits until it delivers.
func (e *env) oneTerm(cfg testCfg) (*runner, *testkit.Logs) {
	cfg.GapWait = 100 * time.Millisecond
	cfg.LockTTL = 30 * time.Second
	r, logs := e.loggedRunner(cfg)
	e.run(r)
	warm := e.produce("warm")
	e.waitFor("the runner delivering", time.Minute, func() bool { return e.delivered(warm) })
	return r, logs
}
