package poller

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/keys"
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
	r := &reader{fence: store.Fence{Lock: keys.PollerLock, Token: 1, Owner: "review"}, cursor: 2000,
		rescanTo: 1 << 40, rescanAt: time.Now(), inflightLow: math.MaxInt64,
		parked: map[store.Aggregate]int64{}, gaps: map[int64]*gapState{}}
	if err := p.maintain(ctx, r, true, 0); err != nil {
		t.Fatal(err)
	}
	if r.saved != 2000 || r.rescanLo == 0 {
		t.Fatalf("maintain saved %d and stepped to %d: the test needs a save (2000) and a step in one call", r.saved, r.rescanLo)
	}
	if r.stepTook >= 300*time.Millisecond {
		t.Errorf("the rescan step was judged to take %v: the cursor save before it (300 ms) was counted in (the next step's span cut to %d from %d)",
			r.stepTook, r.stepSpan, rescanFirst)
	}
}
