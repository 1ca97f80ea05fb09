package store_test

import (
	"context"
	"testing"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/store"
)

// A due retry above the rows a short read scans (beyond its row limit,
// within what an earlier, longer read classified) is held by a gap below
// it like any other row (readSQL, lowids: "e.id < hold.h"): the gap's
// transaction may still commit a lower row of the retry's aggregate.
func TestReadHoldsADueRetryBeyondTheScannedRows(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	base := maxID(t, st)
	enqueue(t, st, ev("deal", "A", 1), ev("deal", "B", 2))
	slow, err := st.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = slow.Rollback(context.Background()) })
	if err := store.Enqueue(ctx, slow, ev("deal", "C", 3)); err != nil {
		t.Fatal(err)
	}
	enqueue(t, st, ev("deal", "C", 4))
	gap, retry := base+3, base+4
	exec(t, st, `UPDATE outbox SET attempts = 1, available_at = now() WHERE id = $1`, retry) // failed once, due again

	res, err := st.Read(ctx, store.FetchLimits{Rows: 10}, store.ReadPos{Cursor: base, Frontier: base})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.NewGaps) != 1 || res.NewGaps[0] != gap || res.Classified != retry {
		t.Fatalf("premise: the long read found gaps %v and classified up to %d; want gap %d, up to %d", res.NewGaps, res.Classified, gap, retry)
	}
	for _, row := range res.Rows {
		if row.ID >= gap {
			t.Fatalf("the long read returned row %d above the gap %d", row.ID, gap)
		}
	}
	// The next read is short (two rows, both still in flight): it scans
	// base+1 and base+2 only; the retry lies beyond, above the gap.
	short := store.FetchLimits{Rows: 2, Skip: []int64{base + 1, base + 2}}
	pos := store.ReadPos{Cursor: base, Frontier: res.Classified,
		Holding: []store.Gap{{ID: gap, Horizon: res.XMax}}, Watch: []int64{gap}}
	res, err = st.Read(ctx, short, pos)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 0 {
		t.Fatalf("the short read returned %+v while the gap %d below it may still commit", res.Rows, gap)
	}
}

// A dead-lettered row above the cursor is settled: the read neither
// returns it nor counts it among the pending rows it saw (readSQL, hot).
// A new holder whose saved cursor lies below one (held there by a gap or
// a parked row) would otherwise send it again without a replay.
func TestReadLeavesDeadRowsAboveTheCursorOut(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	base := maxID(t, st)
	enqueue(t, st, ev("deal", "A", 1), ev("deal", "B", 2))
	dead, live := base+1, base+2
	exec(t, st, `UPDATE outbox SET attempts = 25, last_error = 'gone', dead_at = now() WHERE id = $1`, dead)

	res, err := st.Read(ctx, store.FetchLimits{Rows: 10}, store.ReadPos{Cursor: base, Frontier: base})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 1 || res.Rows[0].ID != live {
		t.Fatalf("rows %+v, want only the live row %d (row %d is dead)", res.Rows, live, dead)
	}
	for _, h := range res.Hot {
		if h.ID == dead {
			t.Fatalf("the dead row %d read as pending (state %c)", dead, h.State)
		}
	}
}

// A due retry above the rows a read scans is not returned while a lower
// untried row of its aggregate, also beyond the scan, is pending (readSQL,
// lowids: its gap committed; a longer read sends the lower one first):
// otherwise the retry went ahead of it, out of its aggregate's order.
func TestReadKeepsADueRetryBehindALowerRowBeyondTheScan(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	base := maxID(t, st)
	enqueue(t, st, ev("deal", "A", 1), ev("deal", "B", 2), ev("deal", "C", 3), ev("deal", "C", 4))
	lower, retry := base+3, base+4
	exec(t, st, `UPDATE outbox SET attempts = 1, available_at = now() WHERE id = $1`, retry) // failed once, due again

	// Two rows in flight fill a short read: it scans base+1 and base+2
	// only; both rows of C lie beyond.
	short := store.FetchLimits{Rows: 2, Skip: []int64{base + 1, base + 2}}
	res, err := st.Read(ctx, short, store.ReadPos{Cursor: base, Frontier: retry})
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range res.Rows {
		if row.ID == retry {
			t.Fatalf("the short read returned the retry %d ahead of the pending row %d of its aggregate: %+v", retry, lower, res.Rows)
		}
	}
	// A full read returns both, in order.
	res, err = st.Read(ctx, store.FetchLimits{Rows: 10, Skip: []int64{base + 1, base + 2}}, store.ReadPos{Cursor: base, Frontier: retry})
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for _, row := range res.Rows {
		ids = append(ids, row.ID)
	}
	if len(ids) != 2 || ids[0] != lower || ids[1] != retry {
		t.Fatalf("the full read returned %v, want [%d %d]", ids, lower, retry)
	}
}
