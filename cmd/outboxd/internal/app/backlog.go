package app

import (
	"context"
	"sync"
	"time"

	"github.com/outboxd/outboxd/store"
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

	lastMu sync.Mutex
	last   store.Stats // the last count, for the console
	lastAt time.Time   // when it was taken; zero: none yet
}

// keep records st, counted at at, as the last count.
func (g *backlogGate) keep(st store.Stats, at time.Time) {
	g.lastMu.Lock()
	defer g.lastMu.Unlock()
	g.last, g.lastAt = st, at
}

// latest is the last count and when it was taken (zero: none yet).
func (g *backlogGate) latest() (store.Stats, time.Time) {
	g.lastMu.Lock()
	defer g.lastMu.Unlock()
	return g.last, g.lastAt
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
