package poller

import (
	"context"
	"testing"
	"time"
)

// A holder that computed its cursor saves it at its first read, with the
// cold pass it still owes (the horizon); a successor that takes over before
// that pass ran owes it in its turn. Without the horizon saved, the
// successor took the cursor as settled, and a row a producer held in flight
// across both starts, below the computed cursor, waited for the periodic
// rescan (an hour here, 5 minutes by default).
func TestColdPassOwedPassesToTheSuccessor(t *testing.T) {
	e := newEnv(t)
	// The pass waits for every transaction of the cluster open at the
	// start: on the shared server another package's open transaction held
	// it past the test's 20 s wait (seen in three runs at 21:45-21:48 on
	// 2026-11-24, branch mutants, with other helpers' suites running).
	e.privatePostgres()
	ctx := context.Background()
	e.produce("A")
	inFlight := e.inFlightBelowTheComputedCursor("A") // open across both holders' starts
	horizon := func() (h int64) {
		if err := e.st.Pool().QueryRow(ctx, `SELECT COALESCE(max(horizon), -1) FROM outbox_cursor`).Scan(&h); err != nil {
			t.Fatal(err)
		}
		return h
	}
	cfg := testConfig()
	a := e.poller(cfg, "")
	a.rescanEvery = time.Hour
	stopA := e.run(a)
	e.waitFor("the first holder's computed cursor saved", 20*time.Second, func() bool { return e.savedCursor() > inFlight.id })
	stopA()
	if h := horizon(); h <= 0 {
		t.Fatalf("the first holder saved horizon %d with its computed cursor, want the cold pass it owes", h)
	}

	b := e.poller(cfg, "")
	b.rescanEvery = time.Hour
	e.run(b)
	// The successor reads: a new row of another aggregate is delivered.
	probe := e.produce("C")
	e.waitFor("the successor's first delivery", 20*time.Second, func() bool { return e.delivered(probe) })
	if e.delivered(inFlight.id) {
		t.Fatal("the row in flight was delivered before it committed")
	}
	inFlight.commit(t)
	e.waitFor("the row in flight at the first holder's start delivered by its successor's cold pass", 20*time.Second,
		func() bool { return e.delivered(inFlight.id) })
	e.waitFor("the successor's pass done and saved (horizon 0)", 20*time.Second, func() bool { return horizon() == 0 })
}

// The owed pass is the one that runs once every producer in flight at the
// start has ended; the passes a holder runs before that, every rescanEvery
// while one still runs, do not pay it. A holder whose term ends while such
// a producer runs, after passes of that kind, hands the pass on all the
// same: the successor does it when the producer commits (its own
// term-start rescan ran before that and missed the row). Cleared when any
// pass starts or completes, the saved horizon said nothing was owed, and
// the row waited for the successor's periodic rescan (an hour here).
func TestColdPassOwedSurvivesThePassesBeforeIt(t *testing.T) {
	e := newEnv(t)
	// The pass waits for every transaction of the cluster open at the start.
	e.privatePostgres()
	inFlight := e.inFlightBelowTheComputedCursor("A") // open across both holders' starts
	cfg := testConfig()
	a := e.poller(cfg, "")
	a.rescanEvery = 200 * time.Millisecond // passes while the producer runs
	stopA := e.run(a)
	e.waitFor("the first holder's computed cursor saved", 20*time.Second, func() bool { return e.savedCursor() > inFlight.id })
	// Six passes over the history, each rescanEvery after the last: over a
	// second of them, so a cursor save (once a second at most) came after
	// the first pass started.
	c := e.savedCursor()
	e.waitFor("the first holder's passes while the producer runs", time.Minute, func() bool { return a.rescanned.Load() >= 6*c })
	stopA()
	if e.delivered(inFlight.id) {
		t.Fatal("the row in flight was delivered before it committed")
	}

	b := e.poller(cfg, "")
	b.rescanEvery = time.Hour
	e.run(b)
	probe := e.produce("C")
	e.waitFor("the successor's first delivery", 20*time.Second, func() bool { return e.delivered(probe) })
	inFlight.commit(t)
	e.waitFor("the row in flight at the first holder's start delivered by its successor's cold pass", 20*time.Second,
		func() bool { return e.delivered(inFlight.id) })
}

// inFlightBelowTheComputedCursor opens a producer transaction of agg and
// writes over 10,000 settled rows above it: a holder that starts now
// computes its cursor 10,000 below the highest id, above the row in flight.
func (e *env) inFlightBelowTheComputedCursor(agg string) *racer {
	e.t.Helper()
	ctx := context.Background()
	inFlight := e.race(agg)
	if _, err := e.st.Pool().Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'deal', 'B', 'deal.funded', '{}' FROM generate_series(1, 10050)`); err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.st.Pool().Exec(ctx, `UPDATE outbox SET dispatched_at = now() WHERE id <> $1`, inFlight.id); err != nil {
		e.t.Fatal(err)
	}
	return inFlight
}
