package store_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/store"
)

// Read decodes a row in few allocations: its payload, its aggregate id and
// not much more. The aggregate and event types, mostly the same from row to
// row, are not made again per row, and the scan's destinations are not
// rebuilt per row (each was an allocation a row). Skip goes as one string,
// not an allocation per id.
func TestReadAllocatesLittlePerRow(t *testing.T) {
	st, _ := testenv.Store(t)
	ctx := context.Background()
	var evs []store.Event
	for i := range 1000 {
		evs = append(evs, ev("deal", fmt.Sprint(i%10), i))
	}
	if err := enqueueB(st, evs...); err != nil {
		t.Fatal(err)
	}
	skip := make([]int64, 3000) // rows in flight elsewhere: none of these
	for i := range skip {
		skip[i] = int64(1_000_000 + i)
	}
	lim := store.FetchLimits{Rows: 1000, RowBytes: 1 << 20, Bytes: 64 << 20, Skip: skip}
	n := testing.AllocsPerRun(3, func() {
		if res, err := st.Read(ctx, lim, store.ReadPos{}); err != nil || len(res.Rows) != 1000 {
			t.Fatal(len(res.Rows), err)
		}
	})
	t.Logf("%.0f allocations per read of 1,000 rows", n)
	if perRow := n / 1000; perRow > 3 {
		t.Errorf("%.1f allocations per row read, want at most 3", perRow)
	}
}
