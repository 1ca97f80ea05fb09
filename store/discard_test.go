package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/store"
)

// A discard is a fenced write: with an older token than the lock's newest
// holder it deletes nothing; taken over between two batches it stops,
// reporting the rows it deleted; the current holder's deletes exactly the
// dead rows, oldest first, batch by batch, and never a pending or
// delivered row.
func TestDiscardIsFencedAndTouchesOnlyDeadRows(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	t0 := time.Now().Add(-time.Hour)
	ids := insertRows(t, st, deadRow{"a", "1", "e", "x", t0, false}, deadRow{"a", "2", "e", "x", t0.Add(time.Second), false},
		deadRow{"a", "3", "e", "x", t0.Add(2 * time.Second), false})
	if _, err := st.Pool().Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, dispatched_at)
		VALUES ('a', '1', 'e', '{}', NULL), ('a', '1', 'e', '{}', now())`); err != nil {
		t.Fatal(err)
	}
	mine := store.Fence{Lock: "lock:reconciliation", Token: 3, Owner: "discard"}
	next := store.Fence{Lock: mine.Lock, Token: 4, Owner: "reconcile"}
	if err := st.ClaimFence(ctx, next); err != nil {
		t.Fatal(err)
	}
	n, err := st.Reconcile().DiscardDead(ctx, mine, store.Discard{Filter: store.DeadFilter{}, BatchSize: 1, Removed: nil})
	if !errors.Is(err, store.ErrStaleFence) || n != 0 || len(listAll(t, st, store.DeadFilter{}, 10)) != 3 {
		t.Fatalf("stale discard: %d, %v; want 0, ErrStaleFence, every dead row kept", n, err)
	}

	mine.Token = 5
	var seen []int64
	n, err = st.Reconcile().DiscardDead(ctx, mine, store.Discard{Filter: store.DeadFilter{}, BatchSize: 1, Removed: func(rows []store.Discarded) {
		for _, r := range rows {
			seen = append(seen, r.ID)
		}
		if len(seen) == 2 {
			if err := st.ClaimFence(ctx, store.Fence{Lock: mine.Lock, Token: 6, Owner: "reconcile"}); err != nil {
				t.Error(err)
			}
		}
	}})
	if !errors.Is(err, store.ErrStaleFence) || n != 2 || len(seen) != 2 || seen[0] != ids[0] || seen[1] != ids[1] {
		t.Fatalf("discard taken over after two batches: %d, %v, removed %v; want 2, ErrStaleFence, %v", n, err, seen, ids[:2])
	}
	if got := listAll(t, st, store.DeadFilter{}, 10); len(got) != 1 || got[0] != ids[2] {
		t.Fatalf("dead rows %v, want the one the discard did not reach (%d)", got, ids[2])
	}
	var left int
	if err := st.Pool().QueryRow(ctx, `SELECT count(*) FROM outbox WHERE dead_at IS NULL`).Scan(&left); err != nil || left != 2 {
		t.Fatalf("pending and delivered rows left: %d, %v; want 2", left, err)
	}
}

// A discarded row's attempt history goes with it; another row's stays.
func TestDiscardRemovesTheRowsAttemptHistory(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	t0 := time.Now().Add(-time.Hour)
	ids := insertRows(t, st, deadRow{"a", "1", "e", "x", t0, false}, deadRow{"b", "1", "e", "x", t0.Add(time.Second), false})
	for _, id := range ids {
		if _, err := st.Pool().Exec(ctx, `INSERT INTO outbox_attempts (outbox_id, attempt, created_at, kind, excerpt, duration_ms, fencing_token)
			SELECT id, 1, created_at, 'http_503', 'down', 20, 1 FROM outbox WHERE id = $1`, id); err != nil {
			t.Fatal(err)
		}
	}
	fence := store.Fence{Lock: "lock:reconciliation", Token: 3, Owner: "discard"}
	if n, err := st.Reconcile().DiscardDead(ctx, fence, store.Discard{Filter: store.DeadFilter{AggregateType: "a"}, BatchSize: 10, Removed: nil}); err != nil || n != 1 {
		t.Fatalf("discard of aggregate type a: %d, %v; want 1", n, err)
	}
	var gone, kept int
	if err := st.Pool().QueryRow(ctx, `SELECT count(*) FILTER (WHERE outbox_id = $1), count(*) FILTER (WHERE outbox_id = $2) FROM outbox_attempts`,
		ids[0], ids[1]).Scan(&gone, &kept); err != nil {
		t.Fatal(err)
	}
	if gone != 0 || kept != 1 {
		t.Errorf("attempt history: %d entries of the discarded row, %d of the other; want 0 and 1", gone, kept)
	}
}
