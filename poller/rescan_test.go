package poller

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/keys"
	"github.com/outboxd/outboxd/internal/testkit"
	"github.com/outboxd/outboxd/store"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A rescan step runs in the read loop, so it is paced by its own cost,
// idle reads or not: after a step that took d, the next starts no sooner
// than stepSpacing × d later: back to back on every idle read, the steps
// of a pass over a long history under a held snapshot would stall the
// reads. Counted in steps, not in a window of time, so that the test does
// not depend on the machine's load.
func TestRescanStepsArePacedByTheirCost(t *testing.T) {
	e := newEnv(t)
	e.insert(2000, 10)
	p := e.poller(testConfig(), "")
	r := &reader{deps: p.readDeps(), rescan: rescanPacer{to: 1 << 40, at: time.Now()}, cur: readCursor{inflightLow: math.MaxInt64}, parked: parkedSet{}}
	ctx := context.Background()
	const want = 4 // three spacings checked
	steps := 0
	// The limit only ends a test whose steps never come again.
	for limit := time.Now().Add(time.Minute); steps < want; {
		if time.Now().After(limit) {
			t.Fatalf("%d rescan steps in 1m of idle reads, want %d", steps, want)
		}
		lo, prevAt, prevTook := r.rescan.lo, r.rescan.stepAt, r.rescan.last
		if err := r.maintain(ctx, true, 0); err != nil {
			t.Fatal(err)
		}
		if r.rescan.lo == lo {
			continue
		}
		steps++
		if began := r.rescan.stepAt.Add(-r.rescan.last); !prevAt.IsZero() && began.Sub(prevAt) < stepSpacing*prevTook {
			t.Fatalf("rescan step %d began %v after the last one ended, which took %v: want at least %d× that", steps, began.Sub(prevAt), prevTook, stepSpacing)
		}
	}
}

// One slow step (Postgres stalled, a lock wait) puts the next off by at
// most maxStepPause, not stepSpacing times its duration: a step that took
// an hour would otherwise stop the rescan for 20 hours.
func TestRescanPauseAfterASlowStepIsCapped(t *testing.T) {
	e := newEnv(t)
	e.insert(100, 10)
	p := e.poller(testConfig(), "")
	now := time.Now()
	r := &reader{deps: p.readDeps(), cur: readCursor{inflightLow: math.MaxInt64}, parked: parkedSet{},
		rescan: rescanPacer{to: 1 << 20, at: now, span: rescanMin, last: time.Hour, stepAt: now.Add(-maxStepPause - time.Second)}}
	if err := r.maintain(context.Background(), true, 0); err != nil {
		t.Fatal(err)
	}
	if r.rescan.lo == 0 {
		t.Fatalf("no rescan step %v after one that took %v: want the pause capped at %v", time.Since(r.rescan.stepAt), time.Hour, maxStepPause)
	}
}

// Rows that re-enter the pending set below the cursor are delivered: a
// replayed dead row at once (it is due through the delayed index), a row
// an operator marked undelivered by hand at the next rescan. The latter is
// no late commit, though later rows of its aggregate went and it looks
// untried in Postgres: Redis holds it delivered. A new holder starts from
// the cursor the last one saved, not from the table's start.
func TestRowsBelowTheCursorAreFound(t *testing.T) {
	e := newEnv(t)
	e.rc.SetRespond(testkit.Statuses(map[string]int{"deal/dead": 400}))
	cfg := testConfig()
	r, logs := e.loggedRunner(cfg)
	r.rescanEvery = 500 * time.Millisecond
	stop := e.run(r)
	dead := e.produce("dead")
	ids := e.insert(50, 5)
	e.waitFor("the rows settled", 20*time.Second, func() bool { return e.count("dispatched_at IS NULL AND dead_at IS NULL") == 0 })
	e.rc.SetRespond(nil)

	if n, err := e.st.ReplayDead(context.Background(), store.Fence{Lock: "lock:reconciliation", Token: 1, Owner: "test-replay"}, store.ReplayFilter{IDs: []int64{dead}}, 10, nil); err != nil || n != 1 {
		t.Fatalf("replay: %d, %v", n, err)
	}
	e.waitFor("the replayed row delivered", 10*time.Second, func() bool { return e.delivered(dead) })

	edited := ids[10]
	before := e.rc.OKCounts()[edited]
	if _, err := e.st.Pool().Exec(context.Background(), `UPDATE outbox SET dispatched_at = NULL WHERE id = $1`, edited); err != nil {
		t.Fatal(err)
	}
	// Its idempotency key still says delivered: marked again without a send.
	e.waitFor("the hand-edited row found and marked", 20*time.Second, func() bool { return e.count("dispatched_at IS NULL") == 0 })
	if e.rc.OKCounts()[edited] != before {
		t.Fatal("the hand-edited row was sent again despite its delivered key")
	}
	if n := testutil.ToFloat64(r.m.LateCommits); n != 0 || logs.Count(`"msg":"late commit"`) != 0 {
		t.Fatalf("the hand-edited row (later rows of its aggregate delivered) warned as a late commit: counter %v, lines:\n%s", n, logs.Tail(20))
	}

	e.waitFor("the cursor saved", 10*time.Second, func() bool {
		var c int64
		_ = e.st.Pool().QueryRow(context.Background(), `SELECT COALESCE(max(cursor), 0) FROM outbox_cursor`).Scan(&c)
		return c >= ids[len(ids)-1]
	})
	stop()
	r2, logs2 := e.loggedRunner(cfg)
	e.run(r2)
	line := logs2.WaitLine(t, 20*time.Second, `"msg":"read path starts"`)
	if strings.Contains(line, `"cursor":0`) {
		t.Fatalf("the new holder starts from the table's start: %s", line)
	}
	after := e.produce("after")
	e.waitFor("the new holder delivering", 20*time.Second, func() bool { return e.delivered(after) })
}

// A rescan step is judged by its own cost (maintain), not by the cursor save
// that may run before it in the same call: counted in, a save (a fenced
// write and its commit, every saveEvery while the cursor moves, and so
// beside nearly every step of a busy relay) would halve the ids per step
// down to rescanMin and space the steps 20 times the save, and a pass over
// a long history would take longer than rescanEvery. The save is made
// 300 ms slow here (a trigger), so the measure cannot mistake one for the
// other whatever the load.
func TestRescanStepIsJudgedByItsOwnCost(t *testing.T) {
	e := newEnv(t)
	e.insert(2000, 10)
	ctx := context.Background()
	if _, err := e.st.Pool().Exec(ctx, `CREATE FUNCTION slow_save() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep(0.3); RETURN NEW; END $$;
CREATE TRIGGER slow_save BEFORE INSERT OR UPDATE ON outbox_cursor FOR EACH ROW EXECUTE FUNCTION slow_save()`); err != nil {
		t.Fatal(err)
	}
	p := e.poller(testConfig(), "")
	r := &reader{deps: p.readDeps(), fence: store.Fence{Lock: keys.PollerLock, Token: 1, Owner: "test"},
		cur: readCursor{at: 2000, inflightLow: math.MaxInt64}, rescan: rescanPacer{to: 1 << 40, at: time.Now()},
		parked: parkedSet{}}
	if err := r.maintain(ctx, true, 0); err != nil {
		t.Fatal(err)
	}
	if r.cur.saved != 2000 || r.rescan.lo == 0 {
		t.Fatalf("maintain saved %d and stepped to %d: the test needs a save (2000) and a step in one call", r.cur.saved, r.rescan.lo)
	}
	if r.rescan.last >= 300*time.Millisecond {
		t.Errorf("the rescan step was judged to take %v: the cursor save before it (300 ms) was counted in (the next step's span cut to %d from %d)",
			r.rescan.last, r.rescan.span, rescanFirst)
	}
}
