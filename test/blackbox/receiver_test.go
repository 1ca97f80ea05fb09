package blackbox

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/outboxd/outboxd/internal/testkit"
)

// Redirects are never followed. 302 and 307 are retryable
// failures, 301 and 308 dead-letter at once; the second server, which the
// Location points at, never sees a request (the signed body goes only to the
// configured URL), and the configured one sees only POSTs.
func TestRedirectsAreNotFollowed(t *testing.T) {
	t.Parallel()
	e := setup(t)
	elsewhere := newRecorder(t, nil)
	codes := map[string]int{"redir/302": 302, "redir/307": 307, "redir/301": 301, "redir/308": 308}
	rc := newRecorder(t, func(req testkit.Request) testkit.Reply {
		if code, ok := codes[req.Agg]; ok {
			return testkit.Reply{Status: code, Header: http.Header{"Location": {elsewhere.URL()}}}
		}
		return testkit.Reply{Status: http.StatusNoContent}
	})
	e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", rc.URL(),
		"OUTBOXD_DISPATCH_WEBHOOK_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	ids := map[int]int64{}
	for agg, code := range codes {
		ids[code] = e.insert("redir", strings.TrimPrefix(agg, "redir/"), `{"secret":"signed body"}`, "")
	}
	e.insertMany("ok", 3, 3)
	e.start()

	// Settled: others delivered; 302/307 tried (or, wrongly, delivered);
	// 301/308 dead (or, wrongly, delivered).
	waitFor(t, "ok rows delivered and every redirect row tried", func() bool {
		if e.count(`aggregate_type = 'ok' AND dispatched_at IS NULL`) > 0 {
			return false
		}
		for _, id := range ids {
			if w := e.row(id); w.Attempts < 1 && !w.settled() {
				return false
			}
		}
		return true
	}, e.describeRows("aggregate_type = 'redir'"))

	if got := elsewhere.Requests(); len(got) > 0 {
		t.Errorf("the redirect target got %d request(s), want none (first: %s %s, signed: %v)",
			len(got), got[0].Method, got[0].Path, got[0].Header.Get("webhook-signature") != "")
	}
	for _, req := range rc.Requests() {
		if req.Method != http.MethodPost {
			t.Errorf("the configured receiver got a %s %s, want only POSTs", req.Method, req.Path)
		}
	}
	for _, code := range []int{302, 307} {
		w := e.row(ids[code])
		if w.Dispatched || w.Dead || w.Attempts < 1 || !strings.Contains(w.LastError, strconv.Itoa(code)) {
			t.Errorf("%d: want not delivered, not dead, attempts >= 1, last_error naming %d; got %s", code, code, w)
		}
	}
	for _, code := range []int{301, 308} {
		w := e.row(ids[code])
		if !w.Dead || w.Dispatched || !strings.Contains(w.LastError, strconv.Itoa(code)) {
			t.Errorf("%d: want dead-lettered at once with last_error naming %d; got %s", code, code, w)
		}
	}
}

// A receiver's reason phrase (Latin-1, NUL, or 6000 bytes of
// UTF-8) never stalls other aggregates; the row counts attempts and
// dead-letters with a readable last_error.
func TestHostileReasonPhrases(t *testing.T) {
	t.Parallel()
	e := setup(t)
	long := strings.Repeat("é", 3000)
	answers := map[string]string{
		"bad/1":  "HTTP/1.1 500 Bad \xe9 thing\r\nContent-Length: 0\r\n\r\n",
		"nul/1":  "HTTP/1.1 500 Bad \x00 thing\r\nContent-Length: 0\r\n\r\n",
		"long/1": "HTTP/1.1 500 " + long + "\r\nContent-Length: 0\r\n\r\n",
	}
	rr := newRawReceiver(t, func(agg string) string {
		if a, ok := answers[agg]; ok {
			return a
		}
		return "HTTP/1.1 204 No Content\r\n\r\n"
	})
	e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", rr.URL(), "OUTBOXD_POLLER_MAX_ATTEMPTS", "3")
	bad := map[string]int64{}
	for agg := range answers {
		typ, id, _ := strings.Cut(agg, "/")
		bad[agg] = e.insert(typ, id, `{}`, "")
	}
	e.insertMany("ok", 5, 4)
	e.start()

	waitFor(t, "every ok row delivered and every hostile row dead", func() bool {
		return e.count(`aggregate_type = 'ok' AND dispatched_at IS NULL`) == 0 &&
			e.count(`aggregate_type <> 'ok' AND dead_at IS NULL`) == 0
	}, func() string {
		return fmt.Sprintf("ok rows undelivered: %d\n%s", e.count(`aggregate_type = 'ok' AND dispatched_at IS NULL`),
			e.describeRows("aggregate_type <> 'ok'")())
	})
	for agg, id := range bad {
		w := e.row(id)
		switch {
		case w.Attempts < 2:
			t.Errorf("%s: attempts %d, want >= 2 (%s)", agg, w.Attempts, w)
		case !utf8.ValidString(w.LastError):
			t.Errorf("%s: last_error is not valid UTF-8: %q", agg, trunc(w.LastError, 200))
		case strings.ContainsRune(w.LastError, 0):
			t.Errorf("%s: last_error contains NUL: %q", agg, trunc(w.LastError, 200))
		case len(w.LastError) > 1000:
			t.Errorf("%s: last_error is %d bytes, want at most 1000", agg, len(w.LastError))
		case !strings.Contains(w.LastError, "500"):
			t.Errorf("%s: last_error does not mention 500: %q", agg, trunc(w.LastError, 200))
		}
		if rr.hitsFor(agg) < 2 {
			t.Errorf("%s: receiver saw %d request(s), want >= 2", agg, rr.hitsFor(agg))
		}
	}
}

// With valid settings, a receiver that never answers one
// aggregate costs that row attempts (timeouts) until it is dead-lettered;
// other aggregates flow.
func TestHangingReceiver(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rc := newRecorder(t, func(req testkit.Request) testkit.Reply {
		if req.Agg == "hang/1" {
			return testkit.Reply{Hang: true}
		}
		return testkit.Reply{Status: http.StatusNoContent}
	})
	e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", rc.URL(), "OUTBOXD_POLLER_MAX_ATTEMPTS", "2")
	id := e.insert("hang", "1", `{}`, "")
	e.insertMany("ok", 5, 3)
	e.start()
	// Rows inserted while the hung one is in flight flow too.
	e.insertMany("late", 3, 2)

	waitFor(t, "other rows delivered and the hung row dead", func() bool {
		return e.count(`aggregate_type <> 'hang' AND dispatched_at IS NULL`) == 0 && e.row(id).Dead
	}, func() string {
		return fmt.Sprintf("other rows undelivered: %d\n%s", e.count(`aggregate_type <> 'hang' AND dispatched_at IS NULL`), e.row(id))
	})
	w := e.row(id)
	low := strings.ToLower(w.LastError)
	if w.Attempts != 2 || !(strings.Contains(low, "timeout") || strings.Contains(low, "deadline exceeded") || strings.Contains(low, "timed out")) {
		t.Errorf("want attempts 2 and a last_error about a timeout; got %s", w)
	}
}

// A traceparent with CR/LF is dropped (with a WARN naming the
// row), not retried; a valid one is forwarded unchanged.
func TestTraceparentWithCRLF(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rc := newRecorder(t, nil)
	e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", rc.URL())
	const valid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	evil := e.insert("trace", "evil", `{}`,
		`{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\nX-Evil: 1"}`)
	good := e.insert("trace", "good", `{}`, `{"traceparent":"`+valid+`"}`)
	rep := e.start()

	waitFor(t, "both rows tried", func() bool {
		w := e.row(evil)
		return e.row(good).settled() && (w.settled() || w.Attempts > 0)
	}, e.describeRows("true"))

	if w := e.row(evil); !w.Dispatched || w.Attempts != 0 {
		t.Errorf("CR/LF traceparent row: want delivered on the first attempt (attempts 0); got %s", w)
	}
	var evilReqs int
	for _, req := range rc.Requests() {
		switch req.ID {
		case evil:
			evilReqs++
			if v, ok := req.Header["Traceparent"]; ok {
				t.Errorf("CR/LF row's request carried traceparent %q, want none", v)
			}
			if v, ok := req.Header["X-Evil"]; ok {
				t.Errorf("CR/LF row's request carried X-Evil %q (header injection)", v)
			}
		case good:
			if got := req.Header.Get("traceparent"); got != valid {
				t.Errorf("valid traceparent forwarded as %q, want %q", got, valid)
			}
		}
	}
	if evilReqs == 0 {
		t.Errorf("the CR/LF row never reached the receiver")
	}
	warns := rep.logsMatching(func(line string, rec map[string]any) bool {
		id, _ := rec["outbox_id"].(float64)
		return rec["level"] == "WARN" && int64(id) == evil && strings.Contains(line, "traceparent")
	})
	if len(warns) == 0 {
		t.Errorf("no WARN log line mentions traceparent with outbox_id %d; logs:\n%s", evil, rep.tail(30))
	}
}
