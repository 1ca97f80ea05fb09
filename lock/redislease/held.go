package redislease

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxd/outboxd/lock"
	"github.com/outboxd/outboxd/lock/internal/hold"
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
	hold      *hold.Hold
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
func (l *Lock) Context() context.Context { return l.hold.Context() }

// TrustedUntil is the local trust deadline: past it the lease may have expired
// in Redis and the holder must not act.
func (l *Lock) TrustedUntil() time.Time { return l.hold.TrustedUntil() }

// renew extends the key on the quorum, owner-checked. ownerChecked says
// lock.ErrCorrupt only when the corrupted keys cost the quorum: no lease
// of ours is left to renew.
func (l *Lock) renew(ctx context.Context) error {
	return l.c.ownerChecked(ctx, l.opts.TTL, l.key, func(ctx context.Context, n redis.UniversalClient) (int64, error) {
		return extendScript.Run(ctx, n, []string{l.key}, l.owner, l.opts.TTL.Milliseconds()).Int64()
	})
}

// Extend renews the lease once (owner-checked) and moves the local trust
// deadline. A gone, foreign or corrupted key (lock.ErrCorrupt) loses the lock.
func (l *Lock) Extend(ctx context.Context) error { return l.hold.Extend(ctx) }

// Release stops the watchdog, cancels the Context (cause lock.ErrReleased) and
// deletes the key if it is still ours (owner-checked), waking waiters. It
// returns lock.ErrNotHeld or lock.ErrOwnedByOther when the lease had already gone.
// Calling it again returns the first result.
func (l *Lock) Release(ctx context.Context) error {
	return l.hold.Release(func() error {
		return l.c.releaseAll(ctx, l.opts.TTL, l.key, l.owner, l.c.channel(l.name))
	})
}
