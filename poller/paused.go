package poller

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/store"
)

// pausedEvery is how often the leader reads the paused destinations again.
const pausedEvery = time.Second

// pausedRead is the set last read, when, by which term (fencing token),
// and the pause generation that term has acknowledged.
type pausedRead struct {
	store store.ReadPath
	sink  dispatch.Sink
	log   *slog.Logger

	at    time.Time
	token int64
	set   map[string]bool
	acked int64
}

// newPausedRead returns the paused destinations' reader, none read yet.
func newPausedRead(st store.ReadPath, sink dispatch.Sink, log *slog.Logger) pausedRead {
	return pausedRead{store: st, sink: sink, log: log}
}

// read reads the destinations an operator paused (`outboxd pause`)
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
func (pr *pausedRead) read(ctx context.Context, f store.Fence) error {
	if pr.token == f.Token && time.Since(pr.at) < pausedEvery {
		return nil
	}
	ps, err := pr.store.ReadPauseSet(ctx)
	if err != nil {
		return fmt.Errorf("reading the paused destinations: %w", err)
	}
	set := make(map[string]bool, len(ps.Names))
	for _, d := range ps.Names {
		set[d] = true
	}
	dispatch.Pause(pr.sink, func(name string) bool { return set[name] })
	prev, acked := pr.set, pr.acked
	if pr.token != f.Token {
		prev, acked = nil, 0 // a new term says where it starts, and acknowledges it
	}
	pr.logChanges(prev, set)
	pr.at, pr.token, pr.set, pr.acked = time.Time{}, f.Token, set, acked
	if ps.Generation > acked {
		if err := pr.store.AckPause(ctx, f, ps.Generation); err != nil {
			return fmt.Errorf("acknowledging the paused destinations: %w", err)
		}
		pr.acked = ps.Generation
	}
	pr.at = time.Now()
	return nil
}

// logChanges logs each destination paused or resumed from prev to set.
func (pr *pausedRead) logChanges(prev, set map[string]bool) {
	for name := range set {
		if !prev[name] {
			pr.log.Info("destination paused", "destination", name)
		}
	}
	for name := range prev {
		if !set[name] {
			pr.log.Info("destination resumed", "destination", name)
		}
	}
}
