package blackbox

import (
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testkit"
)

// Issue 21, finding 4: one aggregate whose receiver answers in 2 s per
// event held every other aggregate until all its events were through (15
// slow events: 5 other aggregates inserted 2 s later were delivered after
// 28 s). Now the others are delivered while the slow aggregate still has
// events pending, and the slow aggregate's events arrive in id order.
func TestSlowAggregateDelaysOnlyItself(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const slowEvents, perEvent = 15, 2 * time.Second
	rc := newRecorder(t, func(req testkit.Request) testkit.Reply {
		if req.Agg == "slow/0" {
			time.Sleep(perEvent) // the scenario: a receiver this slow for one aggregate
		}
		return testkit.Reply{}
	})
	// A lease and a timeout longer than one slow answer: the slow sends go through.
	e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", rc.URL(), "OUTBOXD_DISPATCH_WEBHOOK_TIMEOUT", "10s",
		"OUTBOXD_POLLER_LOCK_TTL", "30s")
	e.insertMany("slow", 1, slowEvents)
	e.start()
	rc.Wait(t, waitTimeout, "the slow aggregate's first event", func(reqs []testkit.Request) bool { return len(reqs) > 0 })
	inserted := time.Now()
	e.insertMany("other", 5, 1)

	var othersAt time.Time
	slowBefore := 0 // slow events received before the last of the others
	rc.Wait(t, time.Duration(slowEvents+5)*perEvent, "the other aggregates delivered", func(reqs []testkit.Request) bool {
		n, slow := 0, 0
		for _, r := range reqs {
			switch {
			case strings.HasPrefix(r.Agg, "other/") && r.OK():
				n++
				if n == 5 {
					othersAt, slowBefore = r.At, slow
				}
			case r.Agg == "slow/0":
				slow++
			}
		}
		return n == 5
	})
	t.Logf("the other aggregates were delivered %.2f s after they were inserted, after %d of the %d slow events",
		othersAt.Sub(inserted).Seconds(), slowBefore, slowEvents)
	if slowBefore >= slowEvents {
		t.Fatalf("the other aggregates were delivered after all %d slow events: the slow aggregate held them", slowEvents)
	}
	rc.Wait(t, time.Duration(slowEvents+5)*perEvent, "every event delivered", func(reqs []testkit.Request) bool {
		ok := 0
		for _, r := range reqs {
			if r.OK() {
				ok++
			}
		}
		return ok >= slowEvents+5
	})
	if v := testkit.OrderViolations(rc.Requests()); len(v) > 0 {
		t.Fatalf("order broken: %s", strings.Join(v, "; "))
	}
}
