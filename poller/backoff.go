package poller

import (
	"math/rand/v2"
	"time"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/store"
)

// failure decides retry or dead-letter. The wait after attempt n is drawn
// from [step/2, step], step = backoff_base·2^(n-1) capped at backoff_max:
// jitter spreads retries, and the floor makes max_attempts a minimum time
// before dead-lettering (see RetryHorizon). A receiver's Retry-After is
// honoured up to backoff_max.
func (p *Poller) failure(it item, now time.Time) store.Failure {
	attempts := it.row.Attempts + 1
	f := store.Failure{ID: it.row.ID, Error: it.err.Error()}
	if dispatch.IsPermanent(it.err) || attempts >= p.cfg.MaxAttempts {
		f.Dead = true
		return f
	}
	step := p.step(attempts)
	delay := step/2 + time.Duration(rand.Int64N(int64(step-step/2)+1))
	delay = max(delay, min(dispatch.RetryAfter(it.err), p.cfg.BackoffMax))
	f.RetryAt = now.Add(delay)
	return f
}

// step is the backoff ceiling after the given failed attempt.
func (p *Poller) step(attempts int) time.Duration {
	if shift := attempts - 1; shift < 40 {
		return min(p.cfg.BackoffMax, p.cfg.BackoffBase<<shift)
	}
	return p.cfg.BackoffMax
}

// RetryHorizon is how long a row that keeps failing (retryable errors, no
// Retry-After) survives before it is dead-lettered: at least min, at most
// max, plus the time the attempts themselves take.
func RetryHorizon(cfg Config) (lo, hi time.Duration) {
	p := &Poller{cfg: cfg.withDefaults()}
	for n := 1; n < p.cfg.MaxAttempts; n++ {
		s := p.step(n)
		lo += s / 2
		hi += s
	}
	return lo, hi
}
