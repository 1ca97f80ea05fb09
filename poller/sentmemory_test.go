package poller

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxd/outboxd/store"
)

// The per-aggregate memory of what was sent (sentMemory) is bounded:
// past maxLastSent aggregates it is cleared and its generation bumped. A
// gap given up before a clear whose aggregate is unknown after it may
// have had a later row sent meanwhile: its late commit is warned and
// counted (lateCommit, the generation check), not logged as order kept.
// The bound is lowered to 2 here; three other aggregates are sent after
// the higher row of the gap's aggregate went.
func TestLateCommitAfterTheSentMemoryWasClearedIsWarned(t *testing.T) {
	e := setup(t)
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

// The sent mark a holder saves is the highest id it or any holder before
// it handed on (maintain: max(inherited, maxSent)), not only its own: a
// holder that sent nothing above its predecessor's mark passes that mark
// on. Here the first holder gives up a gap of aggregate A and delivers
// A's higher row; the second delivers only a retried row below that
// (another aggregate, refused by the first holder's sink) while the gap
// keeps its cursor still; the gap commits under the third, which must warn
// for it. Saved as the second holder's own mark, the third's range ended
// below A's higher row and the late commit went unwarned.
func TestSentMarkPassesThroughAHolderThatSentLess(t *testing.T) {
	e := setup(t)
	cfg := testConfig()
	cfg.GapWait = 300 * time.Millisecond
	cfg.LockTTL = 30 * time.Second // one term per runner (the test counts them)
	lower, higher, refused := e.gapGivenUpBesideARefusedRow(cfg, true)

	r2, logs2 := e.loggedRunner(cfg)
	stop2 := e.run(r2)
	e.waitFor("the refused row delivered by the second holder", time.Minute, func() bool { return e.delivered(refused) })
	// A holder saves at its first read when what it would save differs
	// from what it loaded (no save of its own yet: none is too recent), and
	// that read comes before the one that takes the refused row: its mark
	// is in place once the row is delivered.
	stop2()
	if n := logs2.Count(`"msg":"late commit"`); n != 0 {
		t.Fatalf("the second runner warned %d times before the commit", n)
	}
	if s := e.savedSent(); s < higher {
		t.Fatalf("the second holder saved sent mark %d, below row %d its predecessor handed on", s, higher)
	}

	r3, logs3 := e.loggedRunner(cfg)
	e.run(r3)
	logs3.WaitLine(t, time.Minute, `"msg":"read path starts"`)
	lower.commit(t)
	e.waitFor("the late row delivered", time.Minute, func() bool { return e.delivered(lower.id) })
	oneTerm(t, logs3)
	expectLateCommit(t, logs3, r3, lower.id, higher)
}

// A later row of an aggregate that went first makes a given-up gap late;
// an earlier one does not; a memory cleared since the gap was given up
// says late after the highest id sent; nothing sent and no clear says
// order kept. The bound clears the memory and moves the generation on
// (limit 2: a third aggregate clears it).
func TestSentMemoryJudgesLaterRows(t *testing.T) {
	t.Parallel()
	a, b, c := store.Aggregate{Type: "deal", ID: "A"}, store.Aggregate{Type: "deal", ID: "B"}, store.Aggregate{Type: "deal", ID: "C"}
	cases := []struct {
		name      string
		limit     int
		sent      map[store.Aggregate]int64 // noted in key order a, b, c
		handed    int64
		id        int64
		gen       int // the gap's generation
		wantAfter int64
		wantLate  bool
		wantGen   int
		wantMark  int64
	}{
		{name: "later row sent", sent: map[store.Aggregate]int64{a: 10}, id: 5, wantAfter: 10, wantLate: true, wantMark: 10},
		{name: "earlier row sent", sent: map[store.Aggregate]int64{a: 3}, id: 5, wantMark: 3},
		{name: "nothing sent", id: 5},
		{name: "another aggregate sent", sent: map[store.Aggregate]int64{b: 9}, id: 5, wantMark: 9},
		{name: "cleared before the gap was given up", limit: 2, sent: map[store.Aggregate]int64{a: 6, b: 7, c: 8}, id: 5, gen: 1,
			wantGen: 1, wantMark: 8},
		{name: "cleared since the gap was given up", limit: 2, sent: map[store.Aggregate]int64{a: 6, b: 7, c: 8}, id: 5, gen: 0,
			wantAfter: 8, wantLate: true, wantGen: 1, wantMark: 8},
		{name: "mark handed on above own", sent: map[store.Aggregate]int64{a: 3}, handed: 40, id: 50, wantMark: 40},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := sentMemory{limit: tc.limit}
			s.handedOn(tc.handed)
			for _, agg := range []store.Aggregate{a, b, c} {
				if id, ok := tc.sent[agg]; ok {
					s.note(agg, id)
				}
			}
			after, late := s.laterSent(a, tc.id, tc.gen)
			if after != tc.wantAfter || late != tc.wantLate {
				t.Errorf("laterSent(%d) = %d, %v; want %d, %v", tc.id, after, late, tc.wantAfter, tc.wantLate)
			}
			if g := s.generation(); g != tc.wantGen {
				t.Errorf("generation %d, want %d", g, tc.wantGen)
			}
			if m := s.mark(); m != tc.wantMark {
				t.Errorf("mark %d, want %d", m, tc.wantMark)
			}
		})
	}
}
