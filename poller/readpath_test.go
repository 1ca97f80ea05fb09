package poller

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Two producers on one aggregate without a lock: the lower id commits 2 s
// after the higher. Within gap_wait, the higher waits for it: delivered in
// id order, no late commit. A producer below the gap is not held by it:
// its row goes as soon as it commits, while the gap is still open.
func TestRacingProducersKeepAggregateOrder(t *testing.T) {
	e := setup(t)
	cfg := testConfig()
	cfg.GapWait = 20 * time.Second
	r, logs := e.loggedRunner(cfg)
	e.run(r)
	warm := e.produce("warm")
	e.waitFor("the runner delivering", 20*time.Second, func() bool { return e.delivered(warm) })

	below := e.race("B") // took its id first
	lower := e.race("A") // the slow producer
	higher := e.produce("A")
	other := e.produce("C") // another aggregate, above the gap
	committed := time.Now()
	logs.WaitLines(t, 10*time.Second, "the gap seen", 1, func(l string) bool {
		return strings.Contains(l, `"msg":"waiting for an earlier id"`) && strings.Contains(l, `"outbox_id":`+itoa(lower.id))
	})

	below.commit(t)
	e.waitFor("the row below the gap delivered while the gap is open", 10*time.Second, func() bool { return e.delivered(below.id) })
	if e.delivered(higher) || e.delivered(other) {
		t.Fatal("a row above the open gap was delivered before the gap committed")
	}
	time.Sleep(time.Until(committed.Add(2 * time.Second))) // the scenario: the lower id commits 2 s later
	lower.commit(t)
	e.waitFor("the gap's row and those above it delivered", 10*time.Second, func() bool {
		return e.delivered(lower.id) && e.delivered(higher) && e.delivered(other)
	})
	if a, b := e.firstArrival(lower.id), e.firstArrival(higher); a > b {
		t.Fatalf("aggregate A delivered %d (arrival %d) after %d (arrival %d)", lower.id, a, higher, b)
	}
	e.checkOrder()
	if n := testutil.ToFloat64(r.m.LateCommits); n != 0 || logs.Count(`"msg":"late commit"`) != 0 {
		t.Fatalf("late commits %v within gap_wait", n)
	}
}
