package store_test

import (
	"context"
	"slices"
	"testing"

	"github.com/outboxd/outboxd/store"
)

// The id arrays the relay sends as text literals (int8Array: the read's
// Skip, Complete's delivered ids) mean the same in every query mode a
// postgres.dsn can choose (default_query_exec_mode, e.g. simple_protocol
// behind a transaction pooler): skipped rows stay out of the read,
// delivered rows are marked, an empty list is no ids. Passed as bytes,
// the cached modes took the literal as a binary array and read the
// skipped rows all the same, without an error.
func TestIDArraysMeanTheSameInEveryQueryExecMode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	inEveryExecMode(t, func(_ int, mode string, st *store.Store) {
		// One aggregate per mode: the rows of the modes before are delivered.
		enqueue(t, st, ev(mode, "1", 1), ev(mode, "2", 2), ev(mode, "3", 3))
		f := store.Fence{Lock: "lock:outbox:poller", Token: 1, Owner: "o"}
		if err := st.ClaimFence(ctx, f); err != nil {
			t.Fatal(err)
		}
		lim := store.FetchLimits{Rows: 100, RowBytes: 1 << 20, Bytes: 1 << 24}
		all, err := st.ReadPath().Read(ctx, lim, store.ReadPos{})
		if err != nil {
			t.Fatalf("%s: read: %v", mode, err)
		}
		if len(all.Rows) != 3 {
			t.Fatalf("%s: read %d rows, want the 3 pending", mode, len(all.Rows))
		}
		skip := []int64{all.Rows[0].ID, all.Rows[2].ID}
		lim.Skip = skip
		rest, err := st.ReadPath().Read(ctx, lim, store.ReadPos{})
		if err != nil {
			t.Fatalf("%s: read with Skip: %v", mode, err)
		}
		for _, r := range rest.Rows {
			if slices.Contains(skip, r.ID) {
				t.Errorf("%s: skipped row %d read", mode, r.ID)
			}
		}
		if len(rest.Rows) != 1 {
			t.Errorf("%s: read %d rows with 2 of 3 skipped, want 1", mode, len(rest.Rows))
		}
		if n, _, err := counts(st.ReadPath().Complete(ctx, f, store.Outcomes{Delivered: nil})); err != nil || n != 0 {
			t.Fatalf("%s: Complete of no rows: %d, %v", mode, n, err)
		}
		n, _, err := counts(st.ReadPath().Complete(ctx, f, store.Outcomes{Delivered: done(t, st, skip...)}))
		if err != nil || n != 2 {
			t.Fatalf("%s: Complete of 2 rows marked %d, %v", mode, n, err)
		}
		if !state(t, st, skip[0]).dispatched || !state(t, st, skip[1]).dispatched || state(t, st, all.Rows[1].ID).dispatched {
			t.Errorf("%s: Complete marked other rows than the 2 named", mode)
		}
		if _, _, err := counts(st.ReadPath().Complete(ctx, f, store.Outcomes{Delivered: done(t, st, all.Rows[1].ID)})); err != nil {
			t.Fatalf("%s: Complete: %v", mode, err)
		}
	})
}
