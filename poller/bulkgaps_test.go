package poller

import (
	"context"
	"testing"
	"time"

	"github.com/outboxd/outboxd/store"
)

// One producer transaction that inserts many rows and stays open (a bulk
// load) while others commit leaves that many consecutive gaps. They are
// kept as runs (gaps.go): a read looks up at most maxWatchPerRead of them
// (plus the old ones' turns), however many there are, while every
// guarantee holds: the cursor is saved below them, and when the
// transaction commits its rows are delivered and the one whose aggregate
// went on first is warned and counted as a late commit. Kept one per id,
// each read looked up all 20,000 while they held, and the term kept a map
// entry per id.
func TestBulkTransactionGapsAreBounded(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	cfg := testConfig()
	cfg.BatchSize = 500 // the bulk drains in fewer batches
	r, logs := e.oneTerm(cfg)

	const bulk = 20_000
	if maxWatchPerRead+watchOldPerRead >= bulk/2 {
		t.Fatalf("maxWatchPerRead %d: the test's premise is a bulk well above it", maxWatchPerRead)
	}
	tx, err := e.st.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'deal', CASE WHEN g = 1 THEN 'A' ELSE 'b' || (g % 50) END, 'deal.funded', '{}'
		FROM generate_series(1, $1::int) g ORDER BY g`, bulk); err != nil {
		t.Fatal(err)
	}
	var lo, hi, lowA int64
	var warm int64 // the warm-up row: the highest id visible outside the bulk's transaction
	if err := e.st.Pool().QueryRow(ctx, `SELECT max(id) FROM outbox`).Scan(&warm); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, `SELECT min(id), max(id), min(id) FILTER (WHERE aggregate_id = 'A') FROM outbox WHERE id > $1`, warm).
		Scan(&lo, &hi, &lowA); err != nil {
		t.Fatal(err)
	}
	if hi-lo+1 != bulk {
		t.Fatalf("the bulk took ids %d..%d, want %d consecutive", lo, hi, bulk)
	}
	higher := e.produce("A")
	e.waitFor("the row above the bulk delivered past gap_wait", time.Minute, func() bool { return e.delivered(higher) })
	// The gaps grow old (given up over watchRecent ago) while rows flow.
	for end := time.Now().Add(cfg.GapWait + watchRecent + 500*time.Millisecond); time.Now().Before(end); {
		e.produce("other")
		time.Sleep(50 * time.Millisecond)
	}
	e.waitFor("the cursor saved past the row above", 20*time.Second, func() bool { return e.savedSent() >= higher })
	if c := e.savedCursor(); c >= lo {
		t.Fatalf("saved cursor %d while the bulk's ids from %d may still commit: want it below", c, lo)
	}
	if n := r.gapRuns.Load(); n != 1 {
		t.Fatalf("%d runs of gaps kept for one transaction's %d consecutive ids, want 1", n, bulk)
	}
	bound := int64(maxWatchPerRead + watchOldPerRead + 2)
	if n := r.watchedMost.Load(); n > bound {
		t.Fatalf("a read looked up %d gap ids behind one open transaction of %d rows, want at most %d", n, bulk, bound)
	}

	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	committed := time.Now()
	e.waitFor("every row of the bulk delivered", 4*time.Minute, func() bool {
		var n int
		if err := e.st.Pool().QueryRow(ctx, `SELECT count(*) FROM outbox WHERE id BETWEEN $1 AND $2 AND dispatched_at IS NOT NULL`, lo, hi).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n < bulk && time.Since(committed) > 90*time.Second {
			var lo2, hi2 int64
			_ = e.st.Pool().QueryRow(ctx, `SELECT min(id), max(id) FROM outbox WHERE dispatched_at IS NULL`).Scan(&lo2, &hi2)
			t.Logf("DEBUG delivered %d of %d, pending %d..%d, gap runs %d", n, bulk, lo2, hi2, r.gapRuns.Load())
		}
		return n == bulk
	})
	if n := r.watchedMost.Load(); n > bound {
		t.Fatalf("a read looked up %d gap ids once the bulk committed, want at most %d", n, bound)
	}
	expectLateCommit(t, logs, r, lowA, higher)
}

// A gap found visible parks its aggregate below the cursor; the same
// read's answer for that aggregate's old first row (nothing left from it)
// must not drop it: the row then waited for the rescan while later rows
// of its aggregate went (found with the bulk above: 11,600 of 30,000 rows).
func TestGapFoundVisibleStaysParkedOverTheReadsParkedAnswer(t *testing.T) {
	e := newEnv(t)
	p := e.poller(testConfig(), "")
	now := time.Now()
	a := store.Aggregate{Type: "deal", ID: "A"}
	r := &reader{cur: readCursor{at: 100, frontier: 100}, parked: parkedSet{a: 50},
		gaps: gapWatch{runs: gapSet{{lo: 20, hi: 20, gapState: gapState{seen: now.Add(-time.Minute), givenUp: true}}}}}
	p.advance(r, store.ReadResult{Classified: 100, XMin: 1, XMax: 2,
		Visible: []store.Watched{{ID: 20, Aggregate: a, Pending: true}},
		Parked:  map[store.Aggregate]int64{a: 0}}, 100, now)
	if got, ok := r.parked[a]; !ok || got != 20 {
		t.Fatalf("aggregate parked at %d (%v) after its gap 20 was found pending below the cursor, want 20", got, ok)
	}
}
