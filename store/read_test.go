package store_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"unsafe"

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

// A read's rows take room for the rows it finds, not for its limit: while
// events stream a read finds a few rows, and room for poller.batch_size of
// them made per read (500 Rows, 80 KB) was 88% of what the relay allocated
// at 2k ev/s. In a drain, where every read fills the limit, the room is
// made once per read at its full size, not grown row by row.
func TestReadAllocatesForTheRowsItFinds(t *testing.T) {
	st, _ := testenv.Store(t)
	ctx := context.Background()
	if err := enqueueB(st, ev("deal", "1", 1), ev("deal", "2", 2), ev("deal", "3", 3)); err != nil {
		t.Fatal(err)
	}
	lim := store.FetchLimits{Rows: 1000, RowBytes: 1 << 20, Bytes: 64 << 20}
	read := func() store.ReadResult {
		res, err := st.Read(ctx, lim, store.ReadPos{})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	const reads = 50
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range reads {
		if res := read(); len(res.Rows) != 3 {
			t.Fatalf("read %d rows, want 3", len(res.Rows))
		}
	}
	runtime.ReadMemStats(&after)
	perRead := (after.TotalAlloc - before.TotalAlloc) / reads
	t.Logf("%d bytes allocated per read of 3 rows (limit 1,000)", perRead)
	if room := uint64(1000 * unsafe.Sizeof(store.Row{})); perRead >= room/4 {
		t.Errorf("a read of 3 rows allocated %d bytes, a quarter or more of room for its limit of 1,000 rows (%d bytes)", perRead, room)
	}

	var evs []store.Event
	for i := range 1000 {
		evs = append(evs, ev("deal", fmt.Sprint(i%10), i))
	}
	if err := enqueueB(st, evs...); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if res := read(); len(res.Rows) != 1000 || (i == 1 && cap(res.Rows) != 1000) {
			t.Fatalf("read %d: %d rows in room for %d, want 1,000 in room for 1,000 after a read of 1,000", i+1, len(res.Rows), cap(res.Rows))
		}
	}
}
