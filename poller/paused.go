package poller

import (
	"context"
	"fmt"
	"time"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/store"
)

// pausedEvery is how often the leader reads the paused destinations again.
const pausedEvery = time.Second

// pausedRead is the set last read, when, by which term (fencing token),
// and the pause generation that term has acknowledged.
type pausedRead struct {
	at    time.Time
	token int64
	set   map[string]bool
	acked int64
}

// readPaused reads the destinations an operator paused (`outboxd pause`)
// at a term's first batch and then every pausedEvery, and tells the sink
// (dispatch.Pause): their events are answered NotAttempted, stay pending
// and are charged nothing. Each change is logged (INFO "destination
// paused", "destination resumed"; at a term's start, every paused one).
// Until the term has read the set, it sends nothing: an error here fails
// the batch.
//
// Once the sink holds the set back, the generation read with it is
// acknowledged in Postgres (store.AckPause, fenced by the term), which is
// what `outboxd pause` and `resume` wait for: from then on the sink starts
// no send of a paused destination (dispatch.Breaker checks before each
// send), so after `pause` returns no new send of it starts. An
// acknowledgement that fails is tried again at the next batch. Called by
// the lead goroutine only.
func (p *Poller) readPaused(ctx context.Context, f store.Fence) error {
	if p.paused.token == f.Token && time.Since(p.paused.at) < pausedEvery {
		return nil
	}
	ps, err := p.store.ReadPauseSet(ctx)
	if err != nil {
		return fmt.Errorf("reading the paused destinations: %w", err)
	}
	set := make(map[string]bool, len(ps.Names))
	for _, d := range ps.Names {
		set[d] = true
	}
	dispatch.Pause(p.sink, func(name string) bool { return set[name] })
	prev, acked := p.paused.set, p.paused.acked
	if p.paused.token != f.Token {
		prev, acked = nil, 0 // a new term says where it starts, and acknowledges it
	}
	p.logPauseChanges(prev, set)
	p.paused = pausedRead{token: f.Token, set: set, acked: acked}
	if ps.Generation > acked {
		if err := p.store.AckPause(ctx, f, ps.Generation); err != nil {
			return fmt.Errorf("acknowledging the paused destinations: %w", err)
		}
		p.paused.acked = ps.Generation
	}
	p.paused.at = time.Now()
	return nil
}

// logPauseChanges logs each destination paused or resumed from prev to set.
func (p *Poller) logPauseChanges(prev, set map[string]bool) {
	for name := range set {
		if !prev[name] {
			p.log.Info("destination paused", "destination", name)
		}
	}
	for name := range prev {
		if !set[name] {
			p.log.Info("destination resumed", "destination", name)
		}
	}
}
