package blackbox

import (
	"syscall"
	"testing"
)

// SIGHUP (a log rotation's postrotate, a closed session) never ends a
// leader: `outboxd run` logs it at INFO and goes on leading the same term,
// delivering what comes after; SIGTERM still stops it with exit 0 (the
// cleanup checks that).
func TestHangupDoesNotEndTheLeader(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.set("OUTBOXD_DISPATCH_SINK", "noop")
	r := e.start()
	leading := func(_ string, rec map[string]any) bool {
		return rec["msg"] == "lock acquired" && rec["lock"] == "lock:outbox:poller"
	}
	if !r.awaitLog(waitTimeout, leading) {
		t.Fatalf("no lock acquired within %s; logs:\n%s", waitTimeout, r.tail(20))
	}
	first := e.insert("sighup", "1", `{"n":1}`, "")
	waitFor(t, "the first row delivered", func() bool { return e.row(first).Dispatched }, e.describeRows("id = $1", first))

	r.proc.Signal(syscall.SIGHUP)
	if !r.awaitLog(waitTimeout, func(_ string, rec map[string]any) bool {
		return rec["msg"] == "SIGHUP ignored" && rec["level"] == "INFO"
	}) {
		t.Fatalf("no INFO line \"SIGHUP ignored\" (exited: %v, %v); logs:\n%s", r.exited(), r.proc.Err(), r.tail(20))
	}
	second := e.insert("sighup", "1", `{"n":2}`, "")
	waitFor(t, "the row inserted after SIGHUP delivered", func() bool { return e.row(second).Dispatched }, e.describeRows("id = $1", second))
	if r.exited() {
		t.Fatalf("outboxd run exited after SIGHUP: %v", r.proc.Err())
	}
	for _, msg := range []string{"lock acquired", "lock released", "lock lost"} {
		lines := r.logsMatching(func(_ string, rec map[string]any) bool {
			return rec["msg"] == msg && rec["lock"] == "lock:outbox:poller"
		})
		want := 0
		if msg == "lock acquired" {
			want = 1
		}
		if len(lines) != want {
			t.Errorf("%d %q lines for the poller's lock while running, want %d (one term throughout): %q", len(lines), msg, want, lines)
		}
	}
}
