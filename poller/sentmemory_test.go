package poller

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The per-aggregate memory of what was sent (reader.lastSent) is bounded:
// past maxLastSent aggregates it is cleared and its generation bumped. A
// gap given up before a clear whose aggregate is unknown after it may
// have had a later row sent meanwhile: its late commit is warned and
// counted (lateCommit, the generation check), not logged as order kept.
// The bound is lowered to 2 here; three other aggregates are sent after
// the higher row of the gap's aggregate went.
func TestLateCommitAfterTheSentMemoryWasClearedIsWarned(t *testing.T) {
	e := newEnv(t)
	r, logs, lower, higher := e.givenUpGap(func(r *runner) { r.maxLastSent = 2 })
	var others []int64
	for _, agg := range []string{"B", "C", "D"} {
		others = append(others, e.produce(agg))
	}
	e.waitFor("three other aggregates delivered", time.Minute, func() bool {
		return e.delivered(others[0]) && e.delivered(others[1]) && e.delivered(others[2])
	})
	lower.commit(t)
	e.waitFor("the late row delivered", time.Minute, func() bool { return e.delivered(lower.id) })
	oneTerm(t, logs)
	lines, ok := logs.Await(10*time.Second, 1, func(l string) bool {
		return strings.Contains(l, `"msg":"late commit"`) && strings.Contains(l, `"outbox_id":`+itoa(lower.id)+`,`)
	})
	if !ok {
		t.Fatalf("no late commit WARN for row %d, committed after row %d of its aggregate was sent (the sent memory cleared since); last lines:\n%s",
			lower.id, higher, logs.Tail(10))
	}
	if !strings.Contains(lines[0], `"level":"WARN"`) {
		t.Errorf("late commit line %s is not a WARN", lines[0])
	}
	if n := testutil.ToFloat64(r.m.LateCommits); n != 1 {
		t.Fatalf("outboxd_late_commits_total %v, want 1", n)
	}
}
