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
// honoured up to backoff_max. The wait is a duration: Postgres adds it to
// its own now() (store.Failure.Delay), so the relay's clock never enters
// available_at.
//
// Total over every row: attempts is read from the row as it is, and an
// operator may have written anything there. A negative count counts from 0
// (as Postgres stores it: store.Complete), and a count at or above
// max_attempts dead-letters, however large; nothing overflows or panics.
func (p *Poller) failure(it item) store.Failure {
	prior := max(it.row.Attempts, 0)
	f := store.Failure{ID: it.row.ID, CreatedAt: it.row.CreatedAt, Error: it.err.Error(), Kind: dispatch.FailureKind(it.err)}
	f.Duration, _ = dispatch.SendDuration(it.err)
	if dispatch.IsPermanent(it.err) || prior >= p.cfg.MaxAttempts-1 {
		f.Dead = true
		return f
	}
	step := p.step(prior + 1)
	delay := step/2 + time.Duration(rand.Int64N(int64(step-step/2)+1))
	delay = max(delay, min(dispatch.RetryAfter(it.err), p.cfg.BackoffMax))
	f.Delay = delay
	return f
}

// step is the backoff ceiling after the given failed attempt: backoff_base
// doubled attempts-1 times, capped at backoff_max; never negative, never
// overflowing, for any attempts and any durations.
func (p *Poller) step(attempts int) time.Duration {
	base, ceiling := max(p.cfg.BackoffBase, 0), max(p.cfg.BackoffMax, 0)
	shift := 0
	if attempts > 1 {
		shift = min(attempts-1, 62)
	}
	if base > ceiling>>shift { // base<<shift would pass the cap (or overflow)
		return ceiling
	}
	return base << shift
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
