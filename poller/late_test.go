package poller

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testkit"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The lower id commits after gap_wait: the higher went first; the lower is
// delivered all the same, with a WARN "late commit" naming the aggregate
// and both ids, and counted.
func TestLateCommitIsDeliveredWarnedAndCounted(t *testing.T) {
	e := setup(t)
	r, logs, lower, higher := e.givenUpGap(nil)
	lower.commit(t)
	e.waitFor("the late row delivered", time.Minute, func() bool { return e.delivered(lower.id) })
	oneTerm(t, logs)
	expectLateCommit(t, logs, r, lower.id, higher)
}

// givenUpGap runs a runner whose late commit tests count: one term
// (gap_wait 300 ms), a gap of aggregate A given up and the higher row of A
// delivered past it, the lower row still in flight. set, if not nil,
// adjusts the runner before it runs.
func (e *testBundle) givenUpGap(set func(*runner)) (r *runner, logs *testkit.Logs, lower *racer, higher int64) {
	e.t.Helper()
	cfg := testConfig()
	cfg.GapWait = 300 * time.Millisecond
	// One term throughout (the test counts warnings of one runner; across
	// terms see TestLateCommitAfterTheLeaseMovedIsWarnedAndCounted). With a
	// 2 s TTL a loaded machine can lose the lease.
	cfg.LockTTL = 30 * time.Second
	r, logs = e.loggedRunner(cfg)
	if set != nil {
		set(r)
	}
	e.run(r)
	// The runner reads before the race starts: a holder that starts while a
	// producer is in flight computes its first cursor (store.ReadPath.LoadCursor) and
	// finds such a row by its rescan, not as a late commit.
	warm := e.produce("warm")
	e.waitFor("the runner delivering", time.Minute, func() bool { return e.delivered(warm) })
	lower = e.race("A")
	higher = e.produce("A")
	e.waitFor("the higher id delivered past gap_wait", time.Minute, func() bool { return e.delivered(higher) })
	return r, logs, lower, higher
}

// oneTerm fails the test unless its runner acquired the lock once.
func oneTerm(t *testing.T, logs *testkit.Logs) {
	t.Helper()
	if n := logs.Count(`"msg":"lock acquired"`); n != 1 {
		t.Fatalf("%d terms, want one (the test's premise); last lines:\n%s", n, logs.Tail(20))
	}
}

// expectLateCommit waits for r's one "late commit" WARN naming aggregate
// deal/A, the late id and the id sent before it, and checks r's counter.
func expectLateCommit(t *testing.T, logs *testkit.Logs, r *runner, late, after int64) {
	t.Helper()
	line := logs.WaitLines(t, 10*time.Second, "the late commit WARN", 1, func(l string) bool {
		return strings.Contains(l, `"msg":"late commit"`)
	})[0]
	for _, want := range []string{`"level":"WARN"`, `"aggregate_type":"deal"`, `"aggregate_id":"A"`,
		`"outbox_id":` + itoa(late), `"after_id":` + itoa(after)} {
		if !strings.Contains(line, want) {
			t.Errorf("late commit line %s lacks %s", line, want)
		}
	}
	if n := testutil.ToFloat64(r.m.LateCommits); n != 1 {
		t.Fatalf("outboxd_late_commits_total %v, want 1", n)
	}
}

// savedSent is the sent mark in outbox_cursor (0 if none saved).
func (e *testBundle) savedSent() int64 {
	var n int64
	if err := e.st.Pool().QueryRow(context.Background(), `SELECT COALESCE(max(sent), 0) FROM outbox_cursor`).Scan(&n); err != nil {
		e.t.Fatalf("read the sent mark: %v", err)
	}
	return n
}
