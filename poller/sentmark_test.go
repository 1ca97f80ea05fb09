package poller

import (
	"testing"
	"time"
)

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
	e := newEnv(t)
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
