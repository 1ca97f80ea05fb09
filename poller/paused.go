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

// pausedRead is the set last read, when, and by which term (fencing token).
type pausedRead struct {
	at    time.Time
	token int64
	set   map[string]bool
}

// readPaused reads the destinations an operator paused (`outboxd pause`)
// at a term's first batch and then every pausedEvery, and tells the sink
// (dispatch.Pause): their events are answered NotAttempted, stay pending
// and are charged nothing. Each change is logged (INFO "destination
// paused", "destination resumed"; at a term's start, every paused one). Until the term has read the set, it sends
// nothing: an error here fails the batch. Called by the lead goroutine only.
func (p *Poller) readPaused(ctx context.Context, f store.Fence) error {
	if p.paused.token == f.Token && time.Since(p.paused.at) < pausedEvery {
		return nil
	}
	list, err := p.store.PausedDestinations(ctx)
	if err != nil {
		return fmt.Errorf("reading the paused destinations: %w", err)
	}
	set := make(map[string]bool, len(list))
	for _, d := range list {
		set[d.Destination] = true
	}
	dispatch.Pause(p.sink, func(name string) bool { return set[name] })
	prev := p.paused.set
	if p.paused.token != f.Token {
		prev = nil // a new term says where it starts
	}
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
	p.paused = pausedRead{at: time.Now(), token: f.Token, set: set}
	return nil
}
