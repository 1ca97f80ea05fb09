package blackbox

import (
	"strings"
	"syscall"
	"testing"
	"time"
)

// Black-box tests: a receiver that switches protocols (101) or holds the
// socket cannot stall the relay or its shutdown.

// switchAnswer answers 101 and then keeps the connection open, sending
// nothing more (the probe's WebSocket-style upgrade).
const switchAnswer = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"

// interimAnswer answers 102 Processing, then nothing: no final status.
const interimAnswer = "HTTP/1.1 102 Processing\r\n\r\n"

const okAnswer = "HTTP/1.1 204 No Content\r\n\r\n"

// A 101 (or any 1xx but 100/103) is a failed attempt, retryable, named in
// last_error; the aggregate's row is retried, other aggregates flow, and
// nothing waits for the peer to close.
func TestSwitchingProtocolsIsAFailedAttempt(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rr := newRawReceiver(t, func(agg string) string {
		switch agg {
		case "switch/1":
			return switchAnswer
		case "interim/1":
			return interimAnswer
		}
		return okAnswer
	})
	e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", rr.URL(), "OUTBOXD_POLLER_MAX_ATTEMPTS", "3")
	sw := e.insert("switch", "1", `{}`, "")
	im := e.insert("interim", "1", `{}`, "")
	e.insertMany("ok", 5, 3)
	e.start()
	e.insertMany("late", 3, 2) // inserted while the switched row is in flight

	waitFor(t, "other rows delivered and the switched rows dead", func() bool {
		return e.count(`aggregate_type NOT IN ('switch', 'interim') AND dispatched_at IS NULL`) == 0 &&
			e.row(sw).Dead && e.row(im).Dead
	}, e.describeRows(`dispatched_at IS NULL`))
	for _, c := range []struct {
		id   int64
		code string
	}{{sw, "101"}, {im, "102"}} {
		w := e.row(c.id)
		if w.Attempts != 3 || !strings.Contains(w.LastError, c.code) {
			t.Errorf("want attempts 3 and a last_error naming %s; got %s", c.code, w)
		}
	}
	if n := rr.hitsFor("switch/1"); n != 3 {
		t.Errorf("the switching receiver saw %d requests for the row, want 3 (one per attempt)", n)
	}
}

// SIGTERM returns within shutdown_timeout whatever the peer does: one
// request switched protocols and held, one never answered at all.
func TestShutdownWithHeldSockets(t *testing.T) {
	t.Parallel()
	for _, answer := range []struct{ name, raw string }{{"switch", switchAnswer}, {"silent", ""}} {
		t.Run(answer.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			rr := newRawReceiver(t, func(agg string) string {
				if agg == "held/1" {
					return answer.raw
				}
				return okAnswer
			})
			e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", rr.URL(), "OUTBOXD_POLLER_MAX_ATTEMPTS", "1000",
				"OUTBOXD_POLLER_LOCK_TTL", "60s", "OUTBOXD_DISPATCH_WEBHOOK_TIMEOUT", "30s",
				"OUTBOXD_POLLER_BACKOFF_BASE", "1ms", "OUTBOXD_POLLER_BACKOFF_MAX", "1ms",
				"OUTBOXD_SHUTDOWN_TIMEOUT", "3s")
			e.insert("held", "1", `{}`, "")
			rep := e.start()
			waitFor(t, "the held row sent", func() bool { return rr.hitsFor("held/1") > 0 },
				func() string { return rep.tail(20) })

			start := time.Now()
			rep.proc.Signal(syscall.SIGTERM)
			// shutdown_timeout is 3 s; the bound leaves room for a loaded machine
			// and is far below the peer's hold (until the test ends).
			select {
			case <-rep.proc.Done():
			case <-time.After(12 * time.Second):
				t.Fatalf("outboxd run still running %s after SIGTERM (shutdown_timeout 3s); logs:\n%s", time.Since(start).Round(time.Millisecond), rep.tail(20))
			}
			if rep.proc.Err() != nil {
				t.Errorf("exit after SIGTERM: %v (want 0)", rep.proc.Err())
			}
			t.Logf("exited %s after SIGTERM", time.Since(start).Round(time.Millisecond))
		})
	}
}
