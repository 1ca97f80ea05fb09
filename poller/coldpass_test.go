package poller

import (
	"context"
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/outboxd/outboxd/internal/keys"
	"github.com/outboxd/outboxd/store"
)

// A holder that computed its cursor saves it at its first read, with the
// cold pass it still owes (the horizon); a successor that takes over before
// that pass ran owes it in its turn. Without the horizon saved, the
// successor takes the cursor as settled, and a row a producer held in
// flight across both starts, below the computed cursor, waits for the
// periodic rescan (an hour here, 5 minutes by default).
func TestColdPassOwedPassesToTheSuccessor(t *testing.T) {
	e := setup(t)
	// The pass waits for every transaction of the cluster open at the
	// start: on the shared server another package's open transaction can
	// hold it past the test's 20 s wait.
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
	e := setup(t)
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
func (e *testBundle) inFlightBelowTheComputedCursor(agg string) *racer {
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

// A holder that computes its first cursor (none saved) while a producer is
// in flight below the lowest visible pending row still delivers that row
// once it commits: it keeps rescanning below the computed cursor until every
// transaction in flight at the start has ended.
func TestFirstCursorWaitsForProducersInFlight(t *testing.T) {
	e := setup(t)
	cfg := testConfig()
	cfg.GapWait = 300 * time.Millisecond
	r, _ := e.loggedRunner(cfg)
	lower := e.race("A") // in flight before the runner starts
	higher := e.produce("B")
	e.run(r)
	e.waitFor("the visible row delivered", 20*time.Second, func() bool { return e.delivered(higher) })
	lower.commit(t)
	e.waitFor("the row in flight at the start delivered", 20*time.Second, func() bool { return e.delivered(lower.id) })
}

// A holder that computed its cursor walks the settled history below it in
// one pass, once every producer in flight at the start has ended: not pass
// after pass while one still runs (each pass walks every dead index entry
// of the history a held snapshot keeps), and not at once (LoadCursor just
// looked). The producer in flight below the cursor is still delivered.
// Counted in ids the rescan spanned, not in time. Its own server: the pass
// waits for every transaction of the cluster open at the start to end, and
// on the shared server other packages' tests hold one for up to a minute
// (the wait for the pass then ran out: CI failed).
func TestColdStartWalksTheHistoryOnce(t *testing.T) {
	e := setup(t)
	e.privatePostgres()
	ctx := context.Background()
	lower := e.race("A") // in flight before the runner starts, below the cursor it computes
	if _, err := e.st.Pool().Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'deal', (i % 1000)::text, 'deal.funded', '{}' FROM generate_series(1, 60000) i`); err != nil {
		t.Fatal(err)
	}
	// A report's snapshot, held while the history is delivered: every old
	// version and its pending-index entry stays.
	holder, err := e.st.Pool().BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(ctx) }()
	if _, err := holder.Exec(ctx, `SELECT count(*) FROM outbox`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.Pool().Exec(ctx, `UPDATE outbox SET dispatched_at = now(), attempts = 1`); err != nil {
		t.Fatal(err)
	}
	higher := e.produce("B")
	r, logs := e.loggedRunner(testConfig())
	e.run(r)
	line := logs.WaitLine(t, 20*time.Second, `"msg":"read path starts"`)
	var start struct{ Cursor int64 }
	if err := json.Unmarshal([]byte(line), &start); err != nil || start.Cursor <= lower.id {
		t.Fatalf("read path starts: %s (%v); want a cursor above the row in flight, %d", line, err, lower.id)
	}
	e.waitFor("the visible row delivered", 20*time.Second, func() bool { return e.delivered(higher) })
	e.waitFor("the cursor saved past it", 20*time.Second, func() bool { return e.savedCursor() >= higher })
	if n := r.rescanned.Load(); n != 0 {
		t.Fatalf("the rescan spanned %d ids while the producer in flight at the start still ran: "+
			"it walks the history before anything below the cursor can have changed", n)
	}
	lower.commit(t)
	e.waitFor("the row in flight at the start delivered", 20*time.Second, func() bool { return e.delivered(lower.id) })
	e.waitFor("the cold pass done", 20*time.Second, func() bool { return r.rescanned.Load() >= start.Cursor })
	after := e.produce("C")
	e.waitFor("a later row delivered", 20*time.Second, func() bool { return e.delivered(after) })
	e.waitFor("the cursor saved past it", 20*time.Second, func() bool { return e.savedCursor() >= after })
	if n := r.rescanned.Load(); n != start.Cursor {
		t.Fatalf("the rescan spanned %d ids, want one pass over the %d below the computed cursor", n, start.Cursor)
	}
}

// While a producer in flight at a computed cursor's start still runs, the
// cold pass every rescanEvery is the term's pass: not followed at once by
// the periodic pass over the same ids (both timers start at the load, so
// both came due together and two passes ran back to back, each walking the
// whole settled history). maintain is driven by hand: the rescan is an hour
// apart, both passes due now, the producer's horizon never reached (xmin 0).
func TestColdTimerPassIsTheTermsPass(t *testing.T) {
	e := setup(t)
	e.insert(100, 10)
	p := e.poller(testConfig(), "")
	p.rescanEvery = time.Hour
	const cursor = 20_000
	due := time.Now().Add(-time.Hour)
	r := &reader{deps: p.readDeps(), fence: store.Fence{Lock: keys.PollerLock, Token: 1, Owner: "test"}, loaded: true,
		cur:      readCursor{at: cursor, saved: cursor, savedSent: cursor, inflightLow: math.MaxInt64},
		coldPass: coldPass{to: cursor, horizon: math.MaxUint32, at: due}, rescan: rescanPacer{at: due},
		parked: parkedSet{}}
	ctx := context.Background()
	// Idle reads until one that found no pass running started none (not
	// for 3 s: a pass is paced by its steps' cost, seconds under load).
	for limit := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
		idle := !r.rescan.passing() && p.rescanned.Load() > 0
		if err := r.maintain(ctx, true, 0); err != nil {
			t.Fatal(err)
		}
		if idle && !r.rescan.passing() {
			break
		}
		if time.Now().After(limit) {
			t.Fatalf("a pass still runs after 1m of idle reads (at %d of %d): the test needs them done", r.rescan.lo, r.rescan.to)
		}
	}
	if n := p.rescanned.Load(); n != cursor {
		t.Fatalf("the rescan spanned %d ids, want %d: one pass over (0, %d] while the rescan is an hour apart", n, cursor, cursor)
	}
}

// The last cold pass starts once the snapshot xmin reaches the horizon,
// over the computed cursor; until then a periodic pass starts every
// rescan interval over the term's cursor too; idle clears what is owed
// only once the last pass has started.
func TestColdPassDue(t *testing.T) {
	t.Parallel()
	now := time.Now()
	const every = time.Minute
	cases := []struct {
		name      string
		pass      coldPass
		xmin      uint64
		wantTo    int64
		wantTimer bool
		wantOK    bool
		wantOwed  uint64 // after idle
	}{
		{name: "nothing owed", pass: newColdPass(100, 0, now), xmin: 50},
		{name: "horizon reached", pass: newColdPass(100, 40, now), xmin: 40, wantTo: 100, wantOK: true},
		{name: "horizon not reached, timer not due", pass: newColdPass(100, 40, now), xmin: 39, wantOwed: 40},
		{name: "horizon not reached, timer due", pass: newColdPass(100, 40, now.Add(-every)), xmin: 39,
			wantTo: 300, wantTimer: true, wantOK: true, wantOwed: 40},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := tc.pass
			to, timer, ok := c.due(tc.xmin, now, every, 300)
			if to != tc.wantTo || timer != tc.wantTimer || ok != tc.wantOK {
				t.Errorf("due = %d, timer %v, %v; want %d, timer %v, %v", to, timer, ok, tc.wantTo, tc.wantTimer, tc.wantOK)
			}
			if c.idle(); c.owing() != tc.wantOwed {
				t.Errorf("owed after idle %d, want %d", c.owing(), tc.wantOwed)
			}
		})
	}
}
