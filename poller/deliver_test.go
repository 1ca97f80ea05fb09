package poller

import (
	"context"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/store"
)

// deliver's bookkeeping is a fixed number of allocations per batch, not
// one per aggregate or per row: a batch of 1,000 rows over 1,000
// aggregates (one event per order) costs the same few slices as one over
// 10. Each aggregate's rows grown by append were an allocation per
// aggregate, a fifth of deliver's bytes in a drain.
func TestDeliverAllocatesPerBatch(t *testing.T) {
	p := New(Config{}, Deps{Sink: dispatch.Noop{}, Log: slog.New(slog.DiscardHandler)})
	trusted := func() time.Time { return time.Now().Add(time.Hour) }
	for _, aggs := range []int{10, 1000} {
		items := make([]item, 1000)
		for i := range items {
			items[i].row = store.Row{ID: int64(i + 1), AggregateType: "deal", AggregateID: strconv.Itoa(i % aggs), EventType: "deal.funded"}
		}
		n := testing.AllocsPerRun(5, func() {
			for i := range items {
				items[i].outcome = pending
			}
			p.deliver(context.Background(), items, 1, trusted, func([][]int) {})
		})
		t.Logf("%d aggregates: %.0f allocations per batch of 1,000", aggs, n)
		if n > 100 {
			t.Errorf("%d aggregates: %.0f allocations per batch of 1,000, want at most 100", aggs, n)
		}
	}
}
