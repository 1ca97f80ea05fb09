package redislease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxd/outboxd/lock"
)

// Lock is a held lease. Its Context is cancelled with cause lock.ErrLost when the
// lease can no longer be trusted and with lock.ErrReleased after Release; run all
// work done as holder in it.
type Lock struct {
	c     *Client
	name  string
	key   string
	owner string
	token int64
	opts  lock.Options
	// recovered: the token came from the floor, not the counter.
	recovered bool

	ctx    context.Context
	cancel context.CancelCauseFunc
	expiry *time.Timer   // cancels ctx at the local trust deadline
	done   chan struct{} // closed when the watchdog has returned

	mu        sync.Mutex
	trustedTo time.Time

	releaseOnce sync.Once
	releaseErr  error
}

// Owner is this acquisition's owner value (a fresh UUID).
func (l *Lock) Owner() string { return l.owner }

// Token is the fencing token of this acquisition.
func (l *Lock) Token() int64 { return l.token }

// Recovered reports that Redis had lost this lock's state (restart without
// persistence, FLUSHALL, failover): the token was lifted by the floor. The
// previous holder may not have noticed yet and can go on acting until its
// next renewal or its trust deadline, at most one TTL; a holder that must not
// overlap with it waits that long before acting.
func (l *Lock) Recovered() bool { return l.recovered }

// Context is done once the lock is lost or released; context.Cause tells which.
func (l *Lock) Context() context.Context { return l.ctx }

// TrustedUntil is the local trust deadline: past it the lease may have expired
// in Redis and the holder must not act.
func (l *Lock) TrustedUntil() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.trustedTo
}

func (l *Lock) trustFor(renewStart time.Time) time.Duration {
	until := renewStart.Add(l.opts.TTL - drift(l.opts.TTL) - l.opts.SafetyMargin)
	l.mu.Lock()
	l.trustedTo = until
	l.mu.Unlock()
	return time.Until(until)
}

func (l *Lock) expire() {
	l.lose(fmt.Errorf("%w: not renewed before the local trust deadline", lock.ErrLost))
}

func (l *Lock) lose(cause error) {
	if l.ctx.Err() != nil {
		return
	}
	l.cancel(cause)
	if context.Cause(l.ctx) == cause {
		if h := l.c.hooks.Lost; h != nil {
			h(l.name, cause)
		}
	}
}

// Extend renews the lease once (owner-checked) and moves the local trust
// deadline. A gone, foreign or corrupted key (lock.ErrCorrupt) loses the lock.
func (l *Lock) Extend(ctx context.Context) error {
	if err := l.ctx.Err(); err != nil {
		return context.Cause(l.ctx)
	}
	start := time.Now()
	err := l.c.ownerChecked(ctx, l.opts.TTL, l.key, func(ctx context.Context, n redis.UniversalClient) (int64, error) {
		return extendScript.Run(ctx, n, []string{l.key}, l.owner, l.opts.TTL.Milliseconds()).Int64()
	})
	switch {
	case errors.Is(err, lock.ErrNotHeld), errors.Is(err, lock.ErrOwnedByOther), errors.Is(err, lock.ErrCorrupt):
		// ownerChecked says lock.ErrCorrupt only when the corrupted keys cost the
		// quorum: no lease of ours is left to renew.
		l.lose(errors.Join(lock.ErrLost, err))
		return context.Cause(l.ctx)
	case err != nil:
		return err
	}
	d := l.trustFor(start)
	if d <= 0 {
		// The renewal took so long that the lease we extended may already have
		// lapsed before our call landed.
		l.expire()
		return context.Cause(l.ctx)
	}
	l.expiry.Reset(d)
	if l.ctx.Err() != nil { // expired while we were renewing
		return context.Cause(l.ctx)
	}
	return nil
}

// watchdog renews every RenewInterval; after a failed renewal it retries at
// RetryInterval until the trust deadline (enforced by l.expiry) gives up.
func (l *Lock) watchdog() {
	defer close(l.done)
	t := time.NewTimer(l.opts.RenewInterval)
	defer t.Stop()
	for {
		select {
		case <-l.ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithDeadline(l.ctx, l.TrustedUntil())
		err := l.Extend(rctx)
		cancel()
		next := l.opts.RenewInterval
		if err != nil {
			if l.ctx.Err() != nil {
				return
			}
			if h := l.c.hooks.RenewFailed; h != nil {
				h(l.name, err)
			}
			next = min(next, l.opts.RetryInterval)
		}
		t.Reset(next)
	}
}

// Release stops the watchdog, cancels the Context (cause lock.ErrReleased) and
// deletes the key if it is still ours (owner-checked), waking waiters. It
// returns lock.ErrNotHeld or lock.ErrOwnedByOther when the lease had already gone.
// Calling it again returns the first result.
func (l *Lock) Release(ctx context.Context) error {
	l.releaseOnce.Do(func() {
		l.cancel(lock.ErrReleased)
		l.expiry.Stop()
		<-l.done
		l.releaseErr = l.c.releaseAll(ctx, l.opts.TTL, l.key, l.owner, l.c.channel(l.name))
		if h := l.c.hooks.Released; h != nil {
			h(l.name)
		}
	})
	return l.releaseErr
}
