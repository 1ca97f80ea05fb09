package poller

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxd/outboxd/internal/keys"
	"github.com/outboxd/outboxd/internal/testkit"
)

// retryLater answers the first attempt of id with 429 and a Retry-After of
// secs seconds, everything else 204.
func retryLater(id *int64, secs string) func(testkit.Request) testkit.Reply {
	return func(r testkit.Request) testkit.Reply {
		if r.ID == *id && r.Attempt == 1 {
			return testkit.Reply{Status: http.StatusTooManyRequests, Header: http.Header{"Retry-After": {secs}}}
		}
		return testkit.Reply{}
	}
}

// refusedOnce commits a row of aggregate X whose first attempt the
// receiver answers 429 with a Retry-After of secs seconds, and returns it
// with a config that honours that (up to backoff_max).
func (e *env) refusedOnce(secs string) (x1 int64, cfg testCfg) {
	x1 = e.produce("X")
	e.rc.SetRespond(retryLater(&x1, secs))
	cfg = testConfig()
	cfg.BackoffMax = 10 * time.Second
	return x1, cfg
}

// A row read while an earlier row of its aggregate backs off is blocked,
// and the cursor passes it: its aggregate is parked there (advance), so
// the row goes once the earlier one is delivered, in order with the
// aggregate's later rows. Not parked, it waited for the rescan (an hour
// here) and the later row went first.
func TestRowBlockedBehindABackingOffRowIsParked(t *testing.T) {
	e := newEnv(t)
	x1, cfg := e.refusedOnce("5")
	r := e.poller(cfg, "")
	r.rescanEvery = time.Hour
	e.run(r)
	e.waitFor("the first row refused with Retry-After", 20*time.Second, func() bool { return e.count("attempts = 1") == 1 })
	x2 := e.produce("X")
	probe := e.produce("P") // its delivery says a read above x2 was made
	e.waitFor("a row above the blocked one delivered", 20*time.Second, func() bool { return e.delivered(probe) })
	x3 := e.produce("X")
	if e.delivered(x1) {
		t.Fatalf("premise: row %d was delivered before the reads above the row behind it (Retry-After 5 s)", x1)
	}
	e.waitFor("the aggregate's three rows delivered", 30*time.Second, func() bool {
		return e.delivered(x1) && e.delivered(x2) && e.delivered(x3)
	})
	e.checkOrder()
}

// A holder's saved cursor stays below its parked aggregates' rows
// (saveable): a successor reads them above its cursor, in order with the
// rest of their aggregates. Here the parked row is one blocked behind a
// row backing off; the successor starts once that row is due, with a
// later row of the aggregate committed above the cursor. Saved past the
// parked row, the successor's first read took the due retry and the later
// row, not the parked one (below the cursor, known to no one; its
// term-start rescan runs after that read), and the later row went first.
func TestSavedCursorStaysBelowParkedRows(t *testing.T) {
	e := newEnv(t)
	x1, cfg := e.refusedOnce("6")
	a := e.poller(cfg, "")
	a.rescanEvery = time.Hour
	stopA := e.run(a)
	e.waitFor("the first row refused with Retry-After", 20*time.Second, func() bool { return e.count("attempts = 1") == 1 })
	x2 := e.produce("X") // blocked behind x1: parked once the cursor passes it
	probe := e.produce("P")
	e.waitFor("the sent mark past the blocked row saved", 20*time.Second, func() bool { return e.savedSent() >= probe })
	stopA()
	if e.delivered(x1) {
		t.Fatalf("premise: row %d was delivered by the first holder (Retry-After 6 s)", x1)
	}
	x3 := e.produce("X")
	e.waitFor("the refused row due again", 20*time.Second, func() bool {
		return e.count("available_at <= now() AND attempts = 1") == 1
	})

	b := e.poller(cfg, "")
	b.rescanEvery = time.Hour
	e.run(b)
	e.waitFor("the aggregate's three rows delivered", 30*time.Second, func() bool {
		return e.delivered(x1) && e.delivered(x2) && e.delivered(x3)
	})
	e.checkOrder()
}

// A failed delivery releases its claim (DESIGN, delivery protocol, step 5:
// "Failure: delete the claim"): the row's idempotency key is gone while it
// backs off, so nothing but its own retry decides when it goes again, and
// that retry takes over no claim. Left in place, the retry took over the
// term's own claim and counted it in outboxd_claims_taken_over_total.
func TestFailedDeliveryReleasesItsClaim(t *testing.T) {
	e := newEnv(t)
	x1, cfg := e.refusedOnce("2")
	cfg.ClaimTTL = time.Minute
	r := e.poller(cfg, "")
	e.run(r)
	e.waitFor("the row refused with Retry-After", 20*time.Second, func() bool { return e.count("attempts = 1") == 1 })
	key := keys.New(e.prefix).Idempotency(x1)
	if n, err := e.rdb.Exists(context.Background(), key).Result(); err != nil || n != 0 {
		v, _ := e.rdb.Get(context.Background(), key).Result()
		t.Fatalf("after the failure the row's key %s holds %q (%v), want none", key, v, err)
	}
	e.waitFor("the row delivered on its retry", 30*time.Second, func() bool { return e.delivered(x1) })
	if n := testutil.ToFloat64(r.m.ClaimsTakenOver); n != 0 {
		t.Fatalf("outboxd_claims_taken_over_total %v after one holder's retry, want 0", n)
	}
}
