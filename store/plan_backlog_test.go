package store_test

import (
	"context"
	"testing"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/store"
)

// The read's plan stays linear in the batch when it was made from
// statistics that saw a large backlog pending (an ANALYZE during a
// backlog, or before a history was delivered): estimates of millions of
// pending rows, far above what one read takes.
//
// The read's new-gap check compares each id of (frontier, top] with the
// rows just read. Written as NOT IN (SELECT id FROM hot), it is a hashed
// subplan only while the planner's estimate of hot fits in work_mem ×
// hash_mem_multiplier; above that (millions of pending rows in the
// statistics with the default 4 MB) the subplan scans hot once per id:
// hundreds of thousands of rows compared per read of 1,000, with the same
// buffers, so the plan's rows show it and its buffers do not.
// The session's work_mem (64 kB, hash_mem_multiplier 1) is lowered here
// so that 100k rows pending at the ANALYZE give the plan that the
// defaults (4 MB, 2) give at millions: the same subplan, unhashed.
func TestReadPlannedOnABigBacklogStaysLinear(t *testing.T) {
	t.Parallel()
	setup, dsn := testenv.Store(t)
	ctx := context.Background()
	relay := oneSession(t, dsn, map[string]string{"work_mem": "64kB", "hash_mem_multiplier": "1"})

	// The statistics see 100k rows pending; the read is planned from them.
	enqueueRows(t, setup, 100_000)
	exec(t, setup, `ANALYZE outbox`)
	for range 6 {
		if _, err := relay.ReadPath().Read(ctx, store.FetchLimits{Rows: 10}, store.ReadPos{}); err != nil {
			t.Fatal(err)
		}
	}
	// Delivered; then a batch of new rows above the cursor, read whole.
	exec(t, setup, `UPDATE outbox SET dispatched_at = now()`)
	cursor := maxID(t, setup)
	const batch = 1000
	enqueueRows(t, setup, batch)
	pos := store.ReadPos{Cursor: cursor, Frontier: cursor}
	lim := store.FetchLimits{Rows: batch, RowBytes: 1 << 20, Bytes: 64 << 20}
	res, err := relay.ReadPath().Read(ctx, lim, pos)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != batch || len(res.NewGaps) != 0 || res.Classified != cursor+batch {
		t.Fatalf("read %d rows, %d new gaps, classified to %d; want %d, 0, %d", len(res.Rows), len(res.NewGaps), res.Classified, batch, cursor+batch)
	}
	conn, err := relay.Pool().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	prepared := preparedStatements(t, conn, []hotStatement{{name: "the read (Read, readSQL)", match: "WITH snap AS MATERIALIZED"}}, true)
	args, _ := store.ReadArgs(lim, pos)
	c := explainCost(t, conn, nil, prepared[0], args)
	conn.Release() // the pool's one session, for the next Read
	t.Logf("the read of %d rows, planned with %d pending in the statistics: %d plan rows, %d buffers", batch, 100_000, c.rows, c.buffers)
	if bound := int64(perBatchRow * batch); c.rows > bound || c.buffers > bound {
		t.Errorf("the read: %d plan rows and %d buffers for a batch of %d, want at most %d each: its work grows faster than the batch\n%s",
			c.rows, c.buffers, batch, bound, c.plan)
	}

	// A sink back after an outage: the batch's rows back off, all due
	// again, below the cursor, and a new batch above it. The read looks
	// at both (and takes the retries first).
	exec(t, setup, `UPDATE outbox SET attempts = 1, available_at = created_at + interval '1 microsecond' WHERE id > $1::bigint`, cursor)
	cursor = maxID(t, setup)
	enqueueRows(t, setup, batch)
	pos = store.ReadPos{Cursor: cursor, Frontier: cursor}
	if res, err = relay.ReadPath().Read(ctx, lim, pos); err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != batch || res.Rows[0].Attempts != 1 {
		t.Fatalf("read %d rows, the first tried %d times; want %d, the retries first", len(res.Rows), res.Rows[0].Attempts, batch)
	}
	if conn, err = relay.Pool().Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	args, _ = store.ReadArgs(lim, pos)
	c = explainCost(t, conn, nil, prepared[0], args)
	t.Logf("the read of %d due retries below the cursor and %d rows above: %d plan rows, %d buffers", batch, batch, c.rows, c.buffers)
	if bound := int64(perBatchRow * 2 * batch); c.rows > bound || c.buffers > bound {
		t.Errorf("the read of %d retries and %d new rows: %d plan rows and %d buffers, want at most %d each: its work grows faster than the rows\n%s",
			batch, batch, c.rows, c.buffers, bound, c.plan)
	}
}
