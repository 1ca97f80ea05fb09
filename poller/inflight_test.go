package poller

import (
	"syscall"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testkit"
)

// The cursor a holder saves stays below every row still in flight, those
// of earlier batches (the next reads' FetchLimits.Skip) included
// (fetch: inflightLow; saveable). Here a holder's only batch is held at
// the receiver, its second row of aggregate S not yet sent, while the
// holder goes on reading (idle, the batch's rows skipped) and saving; it
// is killed, and a later row of S is committed. Saved above the rows in
// flight, the cursor handed the second row to the successor's rescan,
// which runs after its first read took the later row: S out of order.
func TestSavedCursorStaysBelowEarlierBatchesInFlight(t *testing.T) {
	e := newEnv(t)
	s1, s2 := e.produce("S"), e.produce("S")
	release := e.rc.Hold(testkit.HoldAggregate("deal/S"))
	cfg := testConfig()
	// The held send is cut at the lease's trust deadline (about a TTL):
	// the holder dies before that, and its successor waits out the TTL.
	cfg.LockTTL = 5 * time.Second
	c := e.startChild("", cfg)
	e.rc.WaitHeld(t, 20*time.Second, 1)
	// Reads with the batch in flight, and a save among them: a row of
	// another aggregate, delivered, moves the sent mark, which is saved
	// (with the cursor) once saveEvery has passed since the last save (the
	// computed cursor's, at the first read).
	other := e.produce("T")
	e.waitFor("a save after the batch was taken (the sent mark at the other row)", 20*time.Second, func() bool {
		return e.savedSent() >= other
	})
	c.signal(t, syscall.SIGKILL)
	_ = c.wait()
	release()
	if e.delivered(s2) {
		t.Fatalf("premise: row %d was sent before the holder died", s2)
	}
	s3 := e.produce("S")
	r := e.poller(testConfig(), "")
	r.rescanEvery = time.Hour
	e.run(r)
	e.waitFor("the aggregate's rows delivered", 30*time.Second, func() bool {
		return e.delivered(s1) && e.delivered(s2) && e.delivered(s3)
	})
	e.checkOrder()
}
