package poller

import (
	"fmt"
	"sync"
	"time"
)

// fetchHealth records how this runner's reads of due rows are going, for
// /readyz (FetchFailure). Written by the batch loop after each fetch, read by
// the HTTP handlers: any goroutine.
type fetchHealth struct {
	mu           sync.Mutex
	failingSince time.Time // first failure of the current run of failures; zero after a success
	err          error     // the latest failure
}

// note records one fetch's result at now.
func (h *fetchHealth) note(err error, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case err == nil:
		h.failingSince, h.err = time.Time{}, nil
	case h.failingSince.IsZero():
		h.failingSince, h.err = now, err
	default:
		h.err = err
	}
}

// FetchFailure is nil unless every fetch of due rows has failed for longer
// than a lease period (poller.lock_ttl): then this replica leads but cannot
// do its job (e.g. a statement_timeout that breaks every query, a table it
// cannot read), and the error says since when and why. A replica standing by
// does not fetch and is never failing here.
func (p *Poller) FetchFailure(now time.Time) error {
	p.health.mu.Lock()
	defer p.health.mu.Unlock()
	if p.health.failingSince.IsZero() || now.Sub(p.health.failingSince) <= p.cfg.LockTTL {
		return nil
	}
	return fmt.Errorf("every fetch of due rows has failed for %s (since %s): %w",
		now.Sub(p.health.failingSince).Round(time.Second), p.health.failingSince.UTC().Format(time.RFC3339), p.health.err)
}
