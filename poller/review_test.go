package poller

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/keys"
	"github.com/outboxd/outboxd/internal/testkit"
	"github.com/outboxd/outboxd/store"
)

// A rescan step is judged by its own cost (maintain), not by the cursor save
// that may run before it in the same call: counted in, a save (a fenced
// write and its commit, every saveEvery while the cursor moves, and so
// beside nearly every step of a busy relay, both at most once a second)
// halved the ids per step down to rescanMin and spaced the steps 20 times
// the save. A pass over 1.2M ids then took 40 minutes, longer than
// rescanEvery. The save is made 300 ms slow here (a trigger), so the
// measure cannot mistake one for the other whatever the load.
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
	r := &reader{fence: store.Fence{Lock: keys.PollerLock, Token: 1, Owner: "review"},
		cur: readCursor{at: 2000, inflightLow: math.MaxInt64}, rescan: rescanPacer{to: 1 << 40, at: time.Now()},
		parked: parkedSet{}}
	if err := p.maintain(ctx, r, true, 0); err != nil {
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

// A batch in flight whose row fails for good (a 400) while its id goes to
// another row (ids handed out again under the leader: a failover to a
// replica that lagged, a restore, setval; here by hand): the failure is
// not written to the new row, which is read again and sent. By id alone,
// the new row was dead-lettered unsent.
func TestFailedBatchInFlightLeavesTheRowThatTookItsID(t *testing.T) {
	e := newEnv(t)
	cfg := testConfig()
	cfg.LockTTL = 30 * time.Second // the held send must outlive the swap
	r, _ := e.loggedRunner(cfg)
	r.rescanEvery = time.Hour // only reading again can find the new row in time
	e.rc.SetRespond(testkit.Statuses(map[string]int{"deal/held": 400}))
	release := e.rc.Hold(testkit.HoldAggregate("deal/held"))
	defer release()
	e.run(r)

	id := produceAs(t, e.st, "held")[0]
	e.rc.WaitHeld(t, 20*time.Second, 1)
	ctx := context.Background()
	if _, err := e.st.Pool().Exec(ctx, `DELETE FROM outbox WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.Pool().Exec(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, created_at)
		OVERRIDING SYSTEM VALUE VALUES ($1, 'deal', 'new', 'deal.funded', '{}', now() + interval '1 second')`, id); err != nil {
		t.Fatal(err)
	}
	release()
	e.waitFor("the held row's 400 answered", 20*time.Second, func() bool {
		for _, q := range e.rc.Requests() {
			if q.ID == id && q.Agg == "deal/held" && q.Status == 400 {
				return true
			}
		}
		return false
	})
	var dead bool
	var attempts int
	e.waitFor("the row that took the id delivered", 20*time.Second, func() bool {
		_ = e.st.Pool().QueryRow(ctx, `SELECT dead_at IS NOT NULL, attempts FROM outbox WHERE id = $1`, id).Scan(&dead, &attempts)
		return dead || e.deliveredAs(id, "new")
	})
	if dead || attempts != 0 {
		t.Fatalf("the row that took the id: dead %v, attempts %d; want delivered, never failed (the failure of the row sent before was written to it)", dead, attempts)
	}
}

// While a producer in flight at a computed cursor's start still runs, the
// cold pass every rescanEvery is the term's pass: not followed at once by
// the periodic pass over the same ids (both timers start at the load, so
// both came due together and two passes ran back to back, each walking the
// whole settled history). maintain is driven by hand: the rescan is an hour
// apart, both passes due now, the producer's horizon never reached (xmin 0).
func TestColdTimerPassIsTheTermsPass(t *testing.T) {
	e := newEnv(t)
	e.insert(100, 10)
	p := e.poller(testConfig(), "")
	p.rescanEvery = time.Hour
	const cursor = 20_000
	due := time.Now().Add(-time.Hour)
	r := &reader{fence: store.Fence{Lock: keys.PollerLock, Token: 1, Owner: "review"}, loaded: true,
		cur:      readCursor{at: cursor, saved: cursor, savedSent: cursor, inflightLow: math.MaxInt64},
		coldPass: coldPass{to: cursor, horizon: math.MaxUint32, at: due}, rescan: rescanPacer{at: due},
		parked: parkedSet{}}
	ctx := context.Background()
	// Idle reads until one that found no pass running started none (not
	// for 3 s: a pass is paced by its steps' cost, seconds under load).
	for limit := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
		idle := !r.rescan.passing() && p.rescanned.Load() > 0
		if err := p.maintain(ctx, r, true, 0); err != nil {
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
