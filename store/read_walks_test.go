package store_test

import (
	"context"
	"testing"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/store"
)

// The read walks its hot rows once for span (the span's top, density,
// highest id and count), once for the batch (out) and once for the rows it
// returns. Only when the batch leaves a hot row behind does it walk them
// again, to tell each row left why (kind h).
func TestReadWalksItsHotRowsAgainOnlyForRowsLeftBehind(t *testing.T) {
	t.Parallel()
	setup, dsn := testenv.Store(t)
	ctx := context.Background()
	relay := oneSession(t, dsn, nil)
	const n = 200
	enqueueRows(t, setup, n)
	for range 6 {
		if _, err := relay.ReadPath().Read(ctx, store.FetchLimits{Rows: 10}, store.ReadPos{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name        string
		bytes       int64 // the batch's byte budget: 1 takes the first row alone
		taken, left int
		walks       int
	}{
		{"every hot row taken", 64 << 20, n, 0, 3},
		{"one row taken, the rest cut", 1, 1, n - 1, 4},
	} {
		lim := store.FetchLimits{Rows: n, RowBytes: 1 << 20, Bytes: c.bytes}
		res, err := relay.ReadPath().Read(ctx, lim, store.ReadPos{})
		if err != nil {
			t.Fatal(err)
		}
		left := 0
		for _, h := range res.Hot {
			if h.State == store.HotCut {
				left++
			}
		}
		if len(res.Rows) != c.taken || left != c.left {
			t.Fatalf("%s: %d rows returned, %d hot rows cut; want %d, %d", c.name, len(res.Rows), left, c.taken, c.left)
		}
		conn, err := relay.Pool().Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		prepared := preparedStatements(t, conn, []hotStatement{{name: "the read (Read, readSQL)", match: "WITH snap AS MATERIALIZED"}}, true)
		args, _ := store.ReadArgs(lim, store.ReadPos{})
		cost := explainCost(t, conn, nil, prepared[0], args)
		conn.Release()
		if got := cost.root.scans("hot"); got != c.walks {
			t.Errorf("%s: the read walked its hot rows %d times, want %d\n%s", c.name, got, c.walks, cost.plan)
		}
	}
}
