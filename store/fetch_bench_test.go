package store_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/store"
)

// The relay's read against the stateless fetch it replaces, on a clean
// table with 100 due rows (no history, no gaps): what the read's extra
// bookkeeping costs per batch. Run both in one invocation on a loaded box:
//
//	go test -run '^$' -bench 'Fetch' -count 5 ./store/
func BenchmarkFetch(b *testing.B) {
	st, _ := testenv.Store(b)
	ctx := context.Background()
	var evs []store.Event
	for i := range 100 {
		evs = append(evs, ev("deal", fmt.Sprint(i%10), i))
	}
	if err := enqueueB(st, evs...); err != nil {
		b.Fatal(err)
	}
	lim := store.FetchLimits{Rows: 100, RowBytes: 1 << 20, Bytes: 16 << 20}
	b.Run("read", func(b *testing.B) {
		for b.Loop() {
			if res, err := st.ReadPath().Read(ctx, lim, store.ReadPos{}); err != nil || len(res.Rows) != 100 {
				b.Fatal(len(res.Rows), err)
			}
		}
	})
	b.Run("fetchdue", func(b *testing.B) {
		for b.Loop() {
			if rows, err := st.ReadPath().FetchDue(ctx, lim); err != nil || len(rows) != 100 {
				b.Fatal(len(rows), err)
			}
		}
	})
}

func enqueueB(st *store.Store, events ...store.Event) error {
	ctx := context.Background()
	tx, err := st.Pool().Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := store.Enqueue(ctx, tx, events...); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
