package poller

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/keys"
	"github.com/outboxd/outboxd/internal/testkit"
	"github.com/outboxd/outboxd/store"
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
	e := setup(t)
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

// savedCursor is the highest cursor saved, 0 if none.
func (e *testBundle) savedCursor() int64 {
	e.t.Helper()
	var c int64
	if err := e.st.Pool().QueryRow(context.Background(), `SELECT COALESCE(max(cursor), 0) FROM outbox_cursor`).Scan(&c); err != nil {
		e.t.Fatal(err)
	}
	return c
}

// A read with a smaller row limit than an earlier one stops its scan early:
// the cursor must not pass the rows beyond what it scanned, though the
// earlier read classified them: passed, the rows would wait for the rescan
// and go after later rows of their aggregates.
func TestShortReadDoesNotPassUnreadRows(t *testing.T) {
	e := setup(t)
	e.enqueue("a1", "a2", "a3", "a4", "a5", "a6", "a7", "a8", "a9", "a10")
	r := e.poller(testConfig(), "")
	f := store.Fence{Lock: keys.PollerLock, Token: 1}
	ctx := context.Background()
	rows, _, err := r.fetch(ctx, f, store.FetchLimits{Rows: 10, Bytes: 1}) // byte budget: the first row only, the rest 'c'
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("read 1: %d rows, cursor %d frontier %d", len(rows), r.rd.cur.at, r.rd.cur.frontier)
	skip := []int64{rows[0].ID}
	rows, _, err = r.fetch(ctx, f, store.FetchLimits{Rows: 2, Skip: skip})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("read 2 (rows 2): %d rows, cursor %d frontier %d", len(rows), r.rd.cur.at, r.rd.cur.frontier)
	for _, x := range rows {
		skip = append(skip, x.ID)
	}
	rows, _, err = r.fetch(ctx, f, store.FetchLimits{Rows: 10, Skip: skip})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("read 3 (rows 10): %d rows, cursor %d", len(rows), r.rd.cur.at)
	if len(rows) != 7 {
		t.Fatalf("read 3 returned %d rows, want the 7 not yet taken", len(rows))
	}
}

// A cursor computed at a first start is saved at the first read, though
// the rows taken keep it where it was: until a cursor is saved, every
// backlog count and reconciliation takes a floor of its own, a walk of a
// pending index's entries (store.Reconcile.SweepFloor).
func TestComputedCursorIsSavedAtTheFirstRead(t *testing.T) {
	e := setup(t)
	e.enqueue("a1", "a2")
	r := e.poller(testConfig(), "")
	f := store.Fence{Lock: keys.PollerLock, Token: 1}
	ctx := context.Background()
	rows, _, err := r.fetch(ctx, f, store.FetchLimits{Rows: 10})
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	if err := e.st.Pool().QueryRow(ctx, `SELECT count(*) FROM outbox_cursor`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || n != 1 {
		t.Fatalf("after the first read (%d rows taken, cursor %d): %d cursors saved, want the computed one", len(rows), r.rd.cur.at, n)
	}
}
