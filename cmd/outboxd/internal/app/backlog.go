package app

import (
	"context"
	"sync"
	"time"
)

// The backlog gauges are counted from Postgres at each scrape
// (store.Stats). The count costs in proportion to the pending rows: about
// 60-300 ms behind a 1M backlog, and a scraper polling every 250 ms (the
// bench; an impatient dashboard) then took a third of Postgres' time in a
// drain. So a count that took longer than slowBacklogCount is not run again
// until backlogSpacing times its duration has passed: the gauges never
// take more than ~5% of a Postgres core, and between two counts a scrape
// sees the last values (at most 20× one count old: 6 s behind a count of
// 300 ms). A quick count (every backlog below ~100k rows) runs at every
// scrape, as before.
const (
	slowBacklogCount = 50 * time.Millisecond
	backlogSpacing   = 20
)

// backlogGate spaces out slow backlog counts. Scrapes may run at once: one
// counts, the others wait for it and then keep its values when it was slow.
type backlogGate struct {
	mu   sync.Mutex
	next time.Time // no count before this
}

// run calls count unless a slow count ran too recently.
func (g *backlogGate) run(ctx context.Context, now func() time.Time, count func(context.Context)) {
	g.mu.Lock()
	defer g.mu.Unlock()
	start := now()
	if start.Before(g.next) {
		return
	}
	count(ctx)
	if took := now().Sub(start); took > slowBacklogCount {
		g.next = start.Add(backlogSpacing * took)
	}
}
