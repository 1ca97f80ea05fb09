package pglease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/lock"
)

// Lock is a held lease. Its Context is cancelled with cause lock.ErrLost
// when the lease can no longer be trusted and with lock.ErrReleased after
// Release; run all work done as holder in it.
type Lock struct {
	c     *Client
	name  string
	owner string
	token int64
	opts  lock.Options
	// recovered: the floor or outbox_fence lifted the token above the row's.
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

// Recovered reports that the token was lifted by lock.Options.Floor or by
// outbox_fence above the lease row's counter: tokens were issued elsewhere
// (another backend, before a switch) or the row lost them, and a
// predecessor may act until its trust deadline, at most one TTL.
func (l *Lock) Recovered() bool { return l.recovered }

// Context is done once the lock is lost or released; context.Cause tells which.
func (l *Lock) Context() context.Context { return l.ctx }

// TrustedUntil is the local trust deadline: past it the lease may have
// expired on Postgres' clock and the holder must not act.
func (l *Lock) TrustedUntil() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.trustedTo
}

// trustFor moves the trust deadline to renewStart + TTL − drift − margin:
// the statement that set expires_at = now() + TTL started after renewStart,
// so Postgres' deadline is later than ours.
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

// ownerChecked runs the extend or release statement and says what it
// found: nil when it acted, lock.ErrNotHeld when the lease was gone,
// lock.ErrOwnedByOther when another owner held it.
func (l *Lock) ownerChecked(ctx context.Context, sql string, args pgx.NamedArgs) error {
	args["lock"], args["owner"], args["token"] = l.name, l.owner, l.token
	var ok bool
	var live *string
	if err := l.c.pool.QueryRow(ctx, sql, args).Scan(&ok, &live); err != nil {
		return fmt.Errorf("lock: postgres: %s: %w", l.name, err)
	}
	switch {
	case ok:
		return nil
	case live != nil && *live != l.owner:
		return lock.ErrOwnedByOther
	}
	return lock.ErrNotHeld
}

// Extend renews the lease once (owner-checked) and moves the local trust
// deadline. A lease found gone or another's is lost.
func (l *Lock) Extend(ctx context.Context) error {
	if err := l.ctx.Err(); err != nil {
		return context.Cause(l.ctx)
	}
	start := time.Now()
	qctx, cancel := context.WithTimeout(ctx, opTimeout(l.opts.TTL))
	err := l.ownerChecked(qctx, l.c.q.extend, pgx.NamedArgs{"ttl_ms": l.opts.TTL.Milliseconds()})
	cancel()
	switch {
	case errors.Is(err, lock.ErrNotHeld), errors.Is(err, lock.ErrOwnedByOther):
		l.lose(errors.Join(lock.ErrLost, err))
		return context.Cause(l.ctx)
	case err != nil:
		return err
	}
	d := l.trustFor(start)
	if d <= 0 {
		// The renewal took so long that the lease may have lapsed before
		// the statement ran.
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

// Release stops the watchdog, cancels the Context (cause lock.ErrReleased)
// and ends the lease if it is still this owner's (owner-checked), notifying
// waiters. It returns lock.ErrNotHeld or lock.ErrOwnedByOther when the
// lease had already gone. Calling it again returns the first result.
func (l *Lock) Release(ctx context.Context) error {
	l.releaseOnce.Do(func() {
		l.cancel(lock.ErrReleased)
		l.expiry.Stop()
		<-l.done
		qctx, cancel := context.WithTimeout(ctx, opTimeout(l.opts.TTL))
		l.releaseErr = l.ownerChecked(qctx, l.c.q.release, pgx.NamedArgs{"channel": Channel})
		cancel()
		if h := l.c.hooks.Released; h != nil {
			h(l.name)
		}
	})
	return l.releaseErr
}
