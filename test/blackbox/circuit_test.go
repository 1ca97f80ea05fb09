package blackbox

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/outboxd/outboxd/internal/testkit"
)

// charged is how many rows a breaker with the default threshold charges a
// failure before it opens: the failures before the one that opens it.
const charged = 4

// The circuit breaker: while the receiver answers 503 the destination's
// circuit opens after a few failures; from then on no row is charged an
// attempt (probes included), the state shows in /status, `outboxd status`
// and the gauge; when the receiver recovers the first probe closes it and
// the whole backlog goes at once, the rows charged before it opened too
// (their backoff here is a minute), in order.
func TestCircuitBreakerChargesNoAttemptsWhileOpen(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var down atomic.Bool
	down.Store(true)
	rc := newRecorder(t, func(testkit.Request) testkit.Reply {
		if down.Load() {
			return testkit.Reply{Status: http.StatusServiceUnavailable}
		}
		return testkit.Reply{Status: http.StatusNoContent}
	})
	e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", rc.URL(),
		"OUTBOXD_POLLER_BACKOFF_BASE", "1m", "OUTBOXD_POLLER_BACKOFF_MAX", "1h",
		"OUTBOXD_DISPATCH_BREAKER_PROBE_INTERVAL", "300ms")
	ids := e.insertMany("cb", 10, 3)
	rep := e.start()

	if !rep.awaitLog(waitTimeout, func(_ string, rec map[string]any) bool {
		return rec["msg"] == "circuit opened" && rec["level"] == "WARN" && rec["destination"] == "default"
	}) {
		t.Fatalf("no WARN circuit opened; log tail:\n%s", rep.tail(20))
	}
	// Several probes while open.
	n := len(rc.Requests())
	rc.Wait(t, waitTimeout, "probes while the circuit is open", func(reqs []testkit.Request) bool { return len(reqs) >= n+5 })
	sum := func() int {
		s := 0
		for _, w := range e.rows("aggregate_type = 'cb'") {
			s += w.Attempts
		}
		return s
	}
	if got := sum(); got > charged {
		t.Errorf("attempts charged while the destination was down: %d, want at most %d\n%s", got, charged, e.describeRows("aggregate_type = 'cb'")())
	}
	if code, st := rep.get("/status"); !strings.Contains(st, `"circuit":"open"`) {
		t.Errorf("/status (%d) does not show the open circuit: %s", code, trunc(st, 800))
	}
	if _, m := rep.get("/metrics"); !strings.Contains(m, `outboxd_circuit_open{destination="default"} 1`) {
		t.Errorf("/metrics lacks outboxd_circuit_open{destination=\"default\"} 1")
	}
	res := runBinary(t, e.vars, exitLimit, "status", "--json")
	var st struct {
		Destinations []struct{ Name, Circuit string }
	}
	if err := json.Unmarshal([]byte(res.stdout), &st); err != nil || len(st.Destinations) != 1 || st.Destinations[0].Circuit != "open" {
		t.Errorf("outboxd status --json does not show the open circuit (%v): %s", err, res)
	}

	down.Store(false)
	waitFor(t, "every row delivered once the receiver is back", func() bool {
		return e.count(`aggregate_type = 'cb' AND dispatched_at IS NULL`) == 0
	}, e.describeRows("aggregate_type = 'cb' AND dispatched_at IS NULL"))
	if !rep.awaitLog(waitTimeout, func(_ string, rec map[string]any) bool {
		return rec["msg"] == "circuit closed" && rec["level"] == "INFO"
	}) {
		t.Errorf("no INFO circuit closed")
	}
	if got := sum(); got > charged {
		t.Errorf("attempts: %d, want at most %d", got, charged)
	}
	if v := testkit.OrderViolations(rc.Requests()); len(v) > 0 {
		t.Errorf("order broken: %v", v)
	}
	if got := len(rc.OKCounts()); got != len(ids) {
		t.Errorf("%d events delivered, want %d", got, len(ids))
	}
	res = runBinary(t, e.vars, exitLimit, "status")
	if !strings.Contains(res.stdout, "CIRCUIT") || !strings.Contains(res.stdout, "closed") {
		t.Errorf("outboxd status does not show the closed circuit: %s", res)
	}
}

// A probe is one send: the event whose delivery closes a circuit is
// delivered once, like every other event, outage after outage (default
// breaker settings; the receiver answers 503, then 200).
func TestTheEventThatClosesACircuitIsDeliveredOnce(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var down atomic.Bool
	rc := newRecorder(t, func(testkit.Request) testkit.Reply {
		if down.Load() {
			return testkit.Reply{Status: http.StatusServiceUnavailable}
		}
		return testkit.Reply{Status: http.StatusOK}
	})
	e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", rc.URL())
	rep := e.start()
	opened := func(_ string, rec map[string]any) bool { return rec["msg"] == "circuit opened" }
	closed := func(_ string, rec map[string]any) bool { return rec["msg"] == "circuit closed" }

	const outages = 3
	var ids []int64
	for k := 1; k <= outages; k++ {
		down.Store(true)
		ids = append(ids, e.insertMany("probe"+strconv.Itoa(k), 8, 2)...)
		waitFor(t, "the circuit open (outage "+strconv.Itoa(k)+")", func() bool {
			return len(rep.logsMatching(opened)) >= k
		}, func() string { return rep.tail(20) })
		down.Store(false)
		waitFor(t, "every row delivered after outage "+strconv.Itoa(k), func() bool {
			return e.count(`dispatched_at IS NULL`) == 0
		}, e.describeRows("dispatched_at IS NULL"))
		waitFor(t, "the circuit closed (outage "+strconv.Itoa(k)+")", func() bool {
			return len(rep.logsMatching(closed)) >= k
		}, func() string { return rep.tail(20) })
	}
	ok := rc.OKCounts()
	for _, id := range ids {
		if n := ok[id]; n != 1 {
			var sends []string
			for _, r := range rc.Requests() {
				if r.ID == id {
					sends = append(sends, fmt.Sprintf("%s status %d token %d", r.At.Format("15:04:05.000"), r.Status, r.Token))
				}
			}
			t.Errorf("event %d delivered %d times, want once: %v", id, n, sends)
		}
	}
	if e.count(`dead_at IS NOT NULL`) != 0 {
		t.Errorf("rows dead-lettered: %s", e.describeRows("dead_at IS NOT NULL")())
	}
}

// A receiver's refusal about itself (401: a rotated credential) is not
// about the events: no row is dead-lettered, the destination's circuit
// opens (gauge, /status), each failed attempt is in the row's history and
// last_error with the status and the receiver's answer, and once the
// receiver accepts every event is delivered, once.
func TestAnAnswerAboutTheDestinationDeadLettersNothing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var refusing atomic.Bool
	refusing.Store(true)
	rc := newRecorder(t, func(testkit.Request) testkit.Reply {
		if refusing.Load() {
			return testkit.Reply{Status: http.StatusUnauthorized}
		}
		return testkit.Reply{Status: http.StatusOK}
	})
	e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", rc.URL(), "OUTBOXD_DISPATCH_BREAKER_PROBE_INTERVAL", "300ms")
	ids := e.insertMany("refused", 8, 2)
	rep := e.start()

	if !rep.awaitLog(waitTimeout, func(_ string, rec map[string]any) bool {
		return rec["msg"] == "circuit opened" && rec["destination"] == "default"
	}) {
		t.Fatalf("no circuit opened on 401s; rows:\n%s\nlog tail:\n%s", e.describeRows("true")(), rep.tail(20))
	}
	if n := e.count(`dead_at IS NOT NULL`); n != 0 {
		t.Fatalf("%d rows dead-lettered on a 401:\n%s", n, e.describeRows("dead_at IS NOT NULL")())
	}
	if _, m := rep.get("/metrics"); !strings.Contains(m, `outboxd_circuit_open{destination="default"} 1`) {
		t.Errorf("/metrics lacks outboxd_circuit_open{destination=\"default\"} 1")
	}
	if code, st := rep.get("/status"); !strings.Contains(st, `"circuit":"open"`) {
		t.Errorf("/status (%d) does not show the open circuit: %s", code, trunc(st, 800))
	}
	// The batch that opened the circuit writes its outcome after the log
	// line: wait for that write.
	waitFor(t, "a row charged an attempt before the circuit opened", func() bool {
		return e.count("attempts > 0") > 0
	}, e.describeRows("true"))
	charged := e.rows("attempts > 0")
	for _, w := range charged {
		if !strings.Contains(w.LastError, "401") {
			t.Errorf("last_error does not show the answer: %s", w)
		}
		var kind, excerpt string
		err := e.pool.QueryRow(context.Background(),
			`SELECT kind, excerpt FROM outbox_attempts WHERE outbox_id = $1 ORDER BY attempt DESC LIMIT 1`, w.ID).Scan(&kind, &excerpt)
		if err != nil || kind != "http_401" || !strings.Contains(excerpt, "401") {
			t.Errorf("row %d's history: kind %q excerpt %q (%v), want kind http_401 and an excerpt naming 401", w.ID, kind, excerpt, err)
		}
	}

	refusing.Store(false)
	waitFor(t, "every row delivered once the receiver accepts", func() bool {
		return e.count(`dispatched_at IS NULL`) == 0
	}, e.describeRows("dispatched_at IS NULL"))
	if n := e.count(`dead_at IS NOT NULL`); n != 0 {
		t.Errorf("%d rows dead-lettered:\n%s", n, e.describeRows("dead_at IS NOT NULL")())
	}
	ok := rc.OKCounts()
	for _, id := range ids {
		if ok[id] != 1 {
			t.Errorf("event %d delivered %d times, want once", id, ok[id])
		}
	}
}
