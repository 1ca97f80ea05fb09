package blackbox

import (
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testkit"
)

// One aggregate whose receiver answers in 2 s per event holds no other
// aggregate: the others are delivered while the slow aggregate still has
// events pending, and the slow aggregate's events arrive in id order.
func TestSlowAggregateDelaysOnlyItself(t *testing.T) {
	t.Parallel()
	e := setup(t)
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

// Slow receivers: while the receiver holds one aggregate's
// request open (a straggler), the other aggregates' events, their next ones
// included, all go through, with the default poller.concurrency: more of
// them than the pipeline holds at once (4 batches of 500), so the
// straggler's batch does not fill it. None of the straggler's later events
// is sent meanwhile, and once it answers, everything arrives in id order.
// Asserted by outcome, not by time: the straggler stays held until the
// others are through.
func TestStragglerDoesNotHoldBackTheOthers(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const others, perAgg = 300, 10 // 3,000 events after the straggler's first
	rc := newRecorder(t, nil)
	release := rc.Hold(testkit.HoldAggregate("straggler/0"))
	defer release()
	// The held request outlives every wait below: no timeout or lease cuts it.
	e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", rc.URL(), "OUTBOXD_DISPATCH_WEBHOOK_TIMEOUT", "3m",
		"OUTBOXD_POLLER_LOCK_TTL", "10m", "OUTBOXD_SHUTDOWN_TIMEOUT", "10s")
	e.insertMany("straggler", 1, 3)
	e.insertMany("other", others, perAgg) // the first batch holds the straggler and others' first events
	e.start()

	rc.Wait(t, 2*time.Minute, "every other event delivered while the straggler is held", func(reqs []testkit.Request) bool {
		ok := map[int64]bool{}
		for _, r := range reqs {
			if strings.HasPrefix(r.Agg, "other/") && r.OK() {
				ok[r.ID] = true
			}
		}
		return len(ok) == others*perAgg
	})
	waitFor(t, "the others marked in Postgres while the straggler is held", func() bool {
		return e.count("aggregate_type = 'other' AND dispatched_at IS NOT NULL") == others*perAgg
	}, e.describeRows("aggregate_type = 'other' AND dispatched_at IS NULL"))
	if held := rc.Held(); held != 1 {
		t.Fatalf("%d requests of the straggler held, want its first only", held)
	}
	for _, r := range rc.Requests() {
		if r.Agg == "straggler/0" && !r.Held {
			t.Fatalf("event %d of the straggler was sent while its first was held: order broken", r.ID)
		}
	}
	if n := e.count("aggregate_type = 'straggler' AND dispatched_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d straggler events marked while its first is held", n)
	}

	release()
	waitFor(t, "every event marked once the straggler answered", func() bool {
		return e.count("dispatched_at IS NULL") == 0
	}, e.describeRows("dispatched_at IS NULL"))
	if v := testkit.OrderViolations(rc.Requests()); len(v) > 0 {
		t.Fatalf("order broken: %s", strings.Join(v, "; "))
	}
}
