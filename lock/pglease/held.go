package pglease

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/lock"
	"github.com/outboxd/outboxd/lock/internal/hold"
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
	hold      *hold.Hold
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
func (l *Lock) Context() context.Context { return l.hold.Context() }

// TrustedUntil is the local trust deadline: past it the lease may have
// expired on Postgres' clock and the holder must not act. The statement
// that set expires_at = now() + TTL started after the attempt did, so
// Postgres' deadline is later than this one.
func (l *Lock) TrustedUntil() time.Time { return l.hold.TrustedUntil() }

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

// renew is the extend statement, bounded by opTimeout.
func (l *Lock) renew(ctx context.Context) error {
	qctx, cancel := context.WithTimeout(ctx, opTimeout(l.opts.TTL))
	defer cancel()
	return l.ownerChecked(qctx, l.c.q.extend, pgx.NamedArgs{"ttl_ms": l.opts.TTL.Milliseconds()})
}

// Extend renews the lease once (owner-checked) and moves the local trust
// deadline. A lease found gone or another's is lost.
func (l *Lock) Extend(ctx context.Context) error { return l.hold.Extend(ctx) }

// Release stops the watchdog, cancels the Context (cause lock.ErrReleased)
// and ends the lease if it is still this owner's (owner-checked), notifying
// waiters. It returns lock.ErrNotHeld or lock.ErrOwnedByOther when the
// lease had already gone. Calling it again returns the first result.
func (l *Lock) Release(ctx context.Context) error {
	return l.hold.Release(func() error {
		qctx, cancel := context.WithTimeout(ctx, opTimeout(l.opts.TTL))
		defer cancel()
		return l.ownerChecked(qctx, l.c.q.release, pgx.NamedArgs{"channel": Channel})
	})
}
