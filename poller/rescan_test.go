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
	e := setup(t)
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
	e := setup(t)
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
	e := setup(t)
	e.rc.SetRespond(testkit.Statuses(map[string]int{"deal/dead": 400}))
	cfg := testConfig()
	r, logs := e.loggedRunner(cfg)
	r.rescanEvery = 500 * time.Millisecond
	stop := e.run(r)
	dead := e.produce("dead")
	ids := e.insert(50, 5)
	e.waitFor("the rows settled", 20*time.Second, func() bool { return e.count("dispatched_at IS NULL AND dead_at IS NULL") == 0 })
	e.rc.SetRespond(nil)

	if n, err := e.st.Reconcile().ReplayDead(context.Background(), store.Fence{Lock: "lock:reconciliation", Token: 1, Owner: "test-replay"}, store.Replay{Filter: store.ReplayFilter{IDs: []int64{dead}}, BatchSize: 10}); err != nil || n != 1 {
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
	e := setup(t)
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

// The pacer lets a step run at once on an idle read and at most every
// rescanPause on a busy one, never sooner than stepSpacing times the last
// step (capped at maxStepPause), and only while a pass has ids left.
func TestRescanPacerDue(t *testing.T) {
	t.Parallel()
	now := time.Now()
	cases := []struct {
		name   string
		pacer  rescanPacer
		idle   bool
		wantOK bool
		lo, hi int64
	}{
		{name: "no pass", pacer: rescanPacer{}, idle: true},
		{name: "first step on an idle read", pacer: rescanPacer{to: 1 << 20}, idle: true, wantOK: true, hi: rescanFirst},
		{name: "last step of a pass", pacer: rescanPacer{lo: 100, to: 300, span: 500}, idle: true, wantOK: true, lo: 100, hi: 300},
		{name: "busy read within rescanPause", pacer: rescanPacer{to: 1 << 20, stepAt: now.Add(-rescanPause / 2)}},
		{name: "busy read after rescanPause", pacer: rescanPacer{to: 1 << 20, stepAt: now.Add(-rescanPause)}, wantOK: true, hi: rescanFirst},
		{name: "within the spacing", idle: true,
			pacer: rescanPacer{to: 1 << 20, span: 1000, last: time.Millisecond, stepAt: now.Add(-stepSpacing*time.Millisecond + time.Microsecond)}},
		{name: "after the spacing", idle: true, wantOK: true, hi: 1000,
			pacer: rescanPacer{to: 1 << 20, span: 1000, last: time.Millisecond, stepAt: now.Add(-stepSpacing * time.Millisecond)}},
		{name: "slow step's pause capped", idle: true, wantOK: true, hi: 1000,
			pacer: rescanPacer{to: 1 << 20, span: 1000, last: time.Hour, stepAt: now.Add(-maxStepPause)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := tc.pacer
			lo, hi, ok := s.due(now, tc.idle)
			if ok != tc.wantOK || lo != tc.lo || hi != tc.hi {
				t.Errorf("due = (%d, %d], %v; want (%d, %d], %v", lo, hi, ok, tc.lo, tc.hi, tc.wantOK)
			}
		})
	}
}

// A step's span halves after a step over twice stepTarget (not below
// rescanMin), doubles after one under half of it (not above rescanSpan),
// and the pass moves on to the step's end.
func TestRescanPacerTookAdaptsTheSpan(t *testing.T) {
	t.Parallel()
	start := time.Now()
	cases := []struct {
		name     string
		span     int64
		took     time.Duration
		wantSpan int64
	}{
		{name: "slow step", span: 4000, took: 3 * stepTarget, wantSpan: 2000},
		{name: "slow step at the least", span: rescanMin, took: 3 * stepTarget, wantSpan: rescanMin},
		{name: "fast step", span: 4000, took: stepTarget / 4, wantSpan: 8000},
		{name: "fast step at the most", span: rescanSpan, took: stepTarget / 4, wantSpan: rescanSpan},
		{name: "on target", span: 4000, took: stepTarget, wantSpan: 4000},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := rescanPacer{to: 1 << 20, span: tc.span}
			s.took(777, start, start.Add(tc.took))
			if s.span != tc.wantSpan || s.lo != 777 || s.last != tc.took || !s.stepAt.Equal(start.Add(tc.took)) {
				t.Errorf("after a step of %v: span %d, lo %d, last %v; want span %d, lo 777, last %v",
					tc.took, s.span, s.lo, s.last, tc.wantSpan, tc.took)
			}
		})
	}
}

// A periodic pass starts once every has passed since the last began, and
// never while one runs; pass starts a pass and leaves that timer as it is.
func TestRescanPacerStartsPasses(t *testing.T) {
	t.Parallel()
	now := time.Now()
	cases := []struct {
		name           string
		pacer          rescanPacer
		wantLo, wantTo int64
		wantAt         time.Time
	}{
		{name: "due", pacer: rescanPacer{at: now.Add(-time.Hour)}, wantTo: 900, wantAt: now},
		{name: "not yet", pacer: rescanPacer{at: now.Add(-time.Minute)}, wantAt: now.Add(-time.Minute)},
		{name: "a pass runs", pacer: rescanPacer{lo: 10, to: 20, at: now.Add(-time.Hour)}, wantLo: 10, wantTo: 20, wantAt: now.Add(-time.Hour)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := tc.pacer
			s.startEvery(now, 30*time.Minute, 900)
			if s.lo != tc.wantLo || s.to != tc.wantTo || !s.at.Equal(tc.wantAt) {
				t.Errorf("startEvery: (%d, %d] at %v; want (%d, %d] at %v", s.lo, s.to, s.at, tc.wantLo, tc.wantTo, tc.wantAt)
			}
		})
	}
	s := rescanPacer{at: now.Add(-time.Minute)}
	if s.pass(500); s.lo != 0 || s.to != 500 || !s.at.Equal(now.Add(-time.Minute)) || !s.passing() {
		t.Errorf("pass(500): (%d, %d] at %v, passing %v; want (0, 500], the timer kept", s.lo, s.to, s.at, s.passing())
	}
}
