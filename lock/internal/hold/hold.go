// Package hold is the part of a held lease that every lock backend shares:
// the Context that the lost-lease signal cancels, the local trust deadline
// that cancels it when renewals stop landing, the watchdog that renews at
// Options.RenewInterval, and the once-only Release; and, before that, the
// wait for a taken lock (Wait). A backend supplies the attempt, the wake on
// a release, and the owner-checked renewal and release; hold decides what
// their answers mean.
package hold

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/outboxd/outboxd/lock"
)

// Drift is the allowance for clock rate differences between this process
// and the backend that judges the lease.
func Drift(ttl time.Duration) time.Duration { return ttl/100 + 2*time.Millisecond }

// Renew renews the lease once, owner-checked. It returns lock.ErrNotHeld
// when the lease is gone, lock.ErrOwnedByOther when another owns it and
// lock.ErrCorrupt when no lease of this owner is left to renew; any other
// error is a failed attempt that may be retried.
type Renew func(ctx context.Context) error

// Hold is the shared state of one held lease. Its guarantee: its Context
// is cancelled with cause lock.ErrLost as soon as a renewal finds the
// lease gone or another's, or the trust deadline (renewal start + TTL −
// drift − margin, on this process' clock) passes without a renewal, and
// with cause lock.ErrReleased by Release; nothing is done as holder after
// either.
type Hold struct {
	name  string
	opts  lock.Options
	hooks lock.Hooks
	renew Renew

	ctx    context.Context
	cancel context.CancelCauseFunc
	expiry *time.Timer   // cancels ctx at the local trust deadline
	done   chan struct{} // closed when the watchdog has returned

	mu        sync.Mutex
	trustedTo time.Time

	releaseOnce sync.Once
	releaseErr  error
}

// Start begins holding lock name, obtained by an attempt that started at
// start (before the backend set the lease's expiry): it sets the trust
// deadline and, unless opts.RenewInterval is negative, starts the
// watchdog. parent's values are kept, not its cancellation. opts must have
// had lock.Options.WithDefaults applied.
func Start(parent context.Context, name string, opts lock.Options, hooks lock.Hooks, start time.Time, renew Renew) *Hold {
	h := &Hold{name: name, opts: opts, hooks: hooks, renew: renew, done: make(chan struct{})}
	// A held lock lives until released or lost, not until the acquiring
	// wait's context ends: the holder decides when to stop.
	h.ctx, h.cancel = context.WithCancelCause(context.WithoutCancel(parent))
	h.expiry = time.AfterFunc(h.trustFor(start), h.expire)
	if opts.RenewInterval > 0 {
		go h.watchdog()
	} else {
		close(h.done)
	}
	return h
}

// Context is done once the lock is lost or released; context.Cause tells which.
func (h *Hold) Context() context.Context { return h.ctx }

// TrustedUntil is the local trust deadline.
func (h *Hold) TrustedUntil() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.trustedTo
}

// trustFor moves the trust deadline to renewStart + TTL − drift − margin:
// the backend set the lease's expiry after renewStart, so its deadline is
// later than ours.
func (h *Hold) trustFor(renewStart time.Time) time.Duration {
	until := renewStart.Add(h.opts.TTL - Drift(h.opts.TTL) - h.opts.SafetyMargin)
	h.mu.Lock()
	h.trustedTo = until
	h.mu.Unlock()
	return time.Until(until)
}

func (h *Hold) expire() {
	h.Lose(fmt.Errorf("%w: not renewed before the local trust deadline", lock.ErrLost))
}

// Lose cancels the Context with cause (which should match lock.ErrLost)
// and reports it to the Lost hook, unless the Context is already done.
func (h *Hold) Lose(cause error) {
	if h.ctx.Err() != nil {
		return
	}
	h.cancel(cause)
	if context.Cause(h.ctx) == cause {
		if f := h.hooks.Lost; f != nil {
			f(h.name, cause)
		}
	}
}

// Extend renews the lease once and moves the trust deadline. A lease found
// gone, another's or corrupted is lost: the error and the Context's cause
// match lock.ErrLost.
func (h *Hold) Extend(ctx context.Context) error {
	if err := h.ctx.Err(); err != nil {
		return context.Cause(h.ctx)
	}
	start := time.Now()
	err := h.renew(ctx)
	switch {
	case errors.Is(err, lock.ErrNotHeld), errors.Is(err, lock.ErrOwnedByOther), errors.Is(err, lock.ErrCorrupt):
		h.Lose(errors.Join(lock.ErrLost, err))
		return context.Cause(h.ctx)
	case err != nil:
		return err
	}
	d := h.trustFor(start)
	if d <= 0 {
		// The renewal took so long that the lease may have lapsed before
		// it landed.
		h.expire()
		return context.Cause(h.ctx)
	}
	h.expiry.Reset(d)
	if h.ctx.Err() != nil { // expired while renewing
		return context.Cause(h.ctx)
	}
	return nil
}

// watchdog renews every RenewInterval; after a failed renewal it retries at
// RetryInterval until the trust deadline (enforced by expiry) gives up.
func (h *Hold) watchdog() {
	defer close(h.done)
	t := time.NewTimer(h.opts.RenewInterval)
	defer t.Stop()
	for {
		select {
		case <-h.ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithDeadline(h.ctx, h.TrustedUntil())
		err := h.Extend(rctx)
		cancel()
		next := h.opts.RenewInterval
		if err != nil {
			if h.ctx.Err() != nil {
				return
			}
			if f := h.hooks.RenewFailed; f != nil {
				f(h.name, err)
			}
			next = min(next, h.opts.RetryInterval)
		}
		t.Reset(next)
	}
}

// Release stops the watchdog, cancels the Context (cause lock.ErrReleased),
// runs end (the backend's owner-checked release) and reports to the
// Released hook. Calling it again returns the first result.
func (h *Hold) Release(end func() error) error {
	h.releaseOnce.Do(func() {
		h.cancel(lock.ErrReleased)
		h.expiry.Stop()
		<-h.done
		h.releaseErr = end()
		if f := h.hooks.Released; f != nil {
			f(h.name)
		}
	})
	return h.releaseErr
}
