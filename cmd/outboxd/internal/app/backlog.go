package app

import (
	"context"
	"sync"
	"time"
)

// The backlog gauges are counted from Postgres at each scrape
// (store.Stats). The count costs in proportion to the pending rows, so a
// scraper polling often during a large drain would take much of Postgres'
// time. A count that took longer than slowBacklogCount is therefore not
// run again until backlogSpacing times its duration has passed: the gauges
// never take more than about a twentieth of a Postgres core, and between
// two counts a scrape sees the last values (at most backlogSpacing times
// one count old). A quick count runs at every scrape.
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
