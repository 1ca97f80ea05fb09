package etcdlease

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/outboxd/outboxd/lock"
	"github.com/outboxd/outboxd/lock/internal/hold"
)

// Lock is a held lease. Its Context is cancelled with cause lock.ErrLost
// when the lease can no longer be trusted and with lock.ErrReleased after
// Release; run all work done as holder in it.
type Lock struct {
	c       *Client
	name    string
	lease   clientv3.LeaseID
	created int64 // the lock key's create revision
	token   int64
	opts    lock.Options
	// recovered: the floor lifted the token above etcd's revision and fence.
	recovered bool
	hold      *hold.Hold
}

// Owner is this acquisition's owner value: its etcd lease's ID in hex.
func (l *Lock) Owner() string { return owner(int64(l.lease)) }

// Token is the fencing token of this acquisition.
func (l *Lock) Token() int64 { return l.token }

// Recovered reports that the token was lifted by lock.Options.Floor above
// etcd's revision and fence counter: etcd lost its data or the tokens were
// issued elsewhere, and a predecessor may act until its trust deadline,
// at most one TTL.
func (l *Lock) Recovered() bool { return l.recovered }

// Context is done once the lock is lost or released; context.Cause tells which.
func (l *Lock) Context() context.Context { return l.hold.Context() }

// TrustedUntil is the local trust deadline: past it the lease may have
// expired in etcd and the holder must not act. etcd granted or renewed the
// lease after the attempt started, so its deadline is later than this one.
func (l *Lock) TrustedUntil() time.Time { return l.hold.TrustedUntil() }

// owned says whether the lock key is still this lock's: nil when it is,
// lock.ErrNotHeld when it is gone, lock.ErrOwnedByOther when it is on
// another lease or was created anew.
func (l *Lock) owned(kvs *clientv3.GetResponse) error {
	switch {
	case len(kvs.Kvs) == 0:
		return lock.ErrNotHeld
	case kvs.Kvs[0].Lease != int64(l.lease) || kvs.Kvs[0].CreateRevision != l.created:
		return lock.ErrOwnedByOther
	}
	return nil
}

// renew keeps the etcd lease alive once and checks that the key is still
// on it.
func (l *Lock) renew(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout(l.opts.TTL))
	defer cancel()
	if _, err := l.c.cli.KeepAliveOnce(ctx, l.lease); err != nil {
		if isLeaseGone(err) {
			return fmt.Errorf("%w: etcd lease %s expired or revoked", lock.ErrNotHeld, l.Owner())
		}
		return fmt.Errorf("lock: etcd: keep-alive %s: %w", l.name, err)
	}
	kvs, err := l.c.cli.Get(ctx, l.c.Key(l.name))
	if err != nil {
		return fmt.Errorf("lock: etcd: check %s: %w", l.name, err)
	}
	return l.owned(kvs)
}

// Extend renews the lease once (owner-checked) and moves the local trust
// deadline. A lease or key found gone, or a key on another lease, is lost.
func (l *Lock) Extend(ctx context.Context) error { return l.hold.Extend(ctx) }

// Release stops the watchdog, cancels the Context (cause lock.ErrReleased),
// deletes the key if it is still on this lock's lease (owner-checked,
// waking waiters) and revokes the lease. It returns lock.ErrNotHeld or
// lock.ErrOwnedByOther when the lease had already gone. Calling it again
// returns the first result.
func (l *Lock) Release(ctx context.Context) error {
	return l.hold.Release(func() error {
		defer l.c.revoke(ctx, l.lease)
		rctx, cancel := context.WithTimeout(ctx, opTimeout(l.opts.TTL))
		defer cancel()
		key := l.c.Key(l.name)
		resp, err := l.c.cli.Txn(rctx).
			If(clientv3.Compare(clientv3.LeaseValue(key), "=", l.lease), clientv3.Compare(clientv3.CreateRevision(key), "=", l.created)).
			Then(clientv3.OpDelete(key)).
			Else(clientv3.OpGet(key)).
			Commit()
		switch {
		case err != nil:
			return fmt.Errorf("lock: etcd: release %s: %w", l.name, err)
		case resp.Succeeded:
			return nil
		}
		return l.owned((*clientv3.GetResponse)(resp.Responses[0].GetResponseRange()))
	})
}
