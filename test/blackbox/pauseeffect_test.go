package blackbox

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
)

// `outboxd pause` returns once the leader has taken the pause into effect:
// an event of the paused destination created right after it returned is
// never sent, while events of another destination created after it are
// delivered one at a time (the leader fetches past it again and again);
// `resume` returns once in effect, and the event is delivered. With no
// replica running, both say that no replica leads and succeed; with the
// leader frozen, pause says the pause is written but not yet acknowledged
// and exits 1.
func TestPauseReturnsOnceInEffect(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rc := newRecorder(t, nil)
	cfg := pausedConfig(t, rc.URL())
	cli := func(args ...string) result {
		return runBinary(t, e.vars, exitLimit, append(args, "--config", cfg)...)
	}
	for _, verb := range []string{"pause", "resume"} {
		if res := cli(verb, "held"); res.code != 0 || !strings.Contains(res.stdout, "no replica leads") {
			t.Errorf("%s with no replica running: want exit 0 saying no replica leads; got %s", verb, res)
		}
	}

	leader := e.start("--config", cfg)
	for round := range 3 {
		if res := cli("pause", "held"); res.code != 0 || !strings.Contains(res.stdout, "acknowledged") {
			t.Fatalf("round %d: pause held: want exit 0, acknowledged; got %s", round, res)
		}
		id := e.insert("held", fmt.Sprint(round), `{}`, "")
		for k := range 3 {
			fid := e.insert("flow", fmt.Sprint(round*10+k), `{}`, "")
			waitFor(t, fmt.Sprintf("round %d: flow event %d delivered", round, fid), func() bool { return e.row(fid).Dispatched },
				e.describeRows("id >= $1", id))
		}
		if r := e.row(id); r.settled() || r.Attempts > 0 {
			t.Fatalf("round %d: an event created after pause returned was handled: %s", round, r)
		}
		for _, r := range rc.Requests() {
			if r.ID == id {
				t.Fatalf("round %d: the receiver got event %d, created after pause returned", round, id)
			}
		}
		if res := cli("resume", "held"); res.code != 0 || !strings.Contains(res.stdout, "acknowledged") {
			t.Fatalf("round %d: resume held: want exit 0, acknowledged; got %s", round, res)
		}
		waitFor(t, fmt.Sprintf("round %d: event %d delivered after resume", round, id), func() bool { return e.row(id).Dispatched },
			e.describeRows("id = $1", id))
	}

	leader.proc.Signal(syscall.SIGSTOP)
	res := cli("pause", "held", "--wait", "300ms")
	leader.proc.Signal(syscall.SIGCONT)
	if res.code != 1 || !strings.Contains(res.stderr, "not yet acknowledged") {
		t.Errorf("pause with the leader frozen: want exit 1, written but not yet acknowledged; got %s", res)
	}
}

// `resume --all` resumes every paused destination, a destination no longer
// configured where it runs included, and names each one it resumed.
func TestResumeAllNamesWhatItResumed(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cfg := pausedConfig(t, "http://127.0.0.1:1/events")
	if res := runBinary(t, e.vars, exitLimit, "pause", "held", "--config", cfg); res.code != 0 {
		t.Fatalf("pause held: %s", res)
	}
	e.set("OUTBOXD_DISPATCH_SINK", "noop") // "held" is no longer configured
	res := runBinary(t, e.vars, exitLimit, "resume", "--all")
	if res.code != 0 || !strings.Contains(res.stdout, `"resumed":"held"`) {
		t.Errorf("resume --all: want exit 0 naming the resumed destination held; got %s", res)
	}
	var left int
	if err := e.pool.QueryRow(t.Context(), `SELECT count(*) FROM outbox_paused_destinations`).Scan(&left); err != nil || left != 0 {
		t.Errorf("paused destinations left after resume --all: %d, %v", left, err)
	}
}
