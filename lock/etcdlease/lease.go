package etcdlease

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/outboxd/outboxd/lock"
	"github.com/outboxd/outboxd/lock/internal/hold"
)

// DefaultKeyPrefix is put before every lock name and fence key.
const DefaultKeyPrefix = "outboxd/"

var _ lock.Lease = (*Client)(nil)

// Client is the etcd lease over one etcd client.
type Client struct {
	cli    *clientv3.Client
	prefix string
	hooks  lock.Hooks
}

// Option configures a Client.
type Option func(*Client)

// WithKeyPrefix puts prefix before every key instead of DefaultKeyPrefix.
func WithKeyPrefix(prefix string) Option { return func(c *Client) { c.prefix = prefix } }

// WithHooks installs observers.
func WithHooks(h lock.Hooks) Option { return func(c *Client) { c.hooks = h } }

// New returns a Client over cli; the caller closes cli.
func New(cli *clientv3.Client, opts ...Option) *Client {
	c := &Client{cli: cli, prefix: DefaultKeyPrefix}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Key is the etcd key of lock name.
func (c *Client) Key(name string) string { return c.prefix + name }

// FenceKey is the etcd key of lock name's token counter.
func (c *Client) FenceKey(name string) string { return c.prefix + "fence/" + name }

// leaseTTL is ttl in etcd's whole seconds, rounded up.
func leaseTTL(ttl time.Duration) int64 { return max(int64((ttl+time.Second-1)/time.Second), 1) }

// opTimeout bounds one request: small against the TTL, so a slow etcd
// costs an attempt, not the lease.
func opTimeout(ttl time.Duration) time.Duration { return max(ttl/3, 100*time.Millisecond) }

// Acquire waits for the lock until it is obtained, opts.Wait passes or ctx
// is done. On failure the error is lock.ErrNotObtained (a *lock.HolderError
// when another owner held it on the last attempt) joined with the wait's
// context error and the last etcd error, if any.
func (c *Client) Acquire(ctx context.Context, name string, opts lock.Options) (lock.Held, error) {
	return held(c.acquire(ctx, name, opts))
}

// TryAcquire makes one attempt and does not wait. Its errors are Acquire's.
func (c *Client) TryAcquire(ctx context.Context, name string, opts lock.Options) (lock.Held, error) {
	opts, err := opts.WithDefaults()
	if err != nil {
		return nil, err
	}
	l, _, err := c.try(ctx, name, opts, time.Now())
	return held(l, err)
}

// held returns l as a lock.Held, and nil (not a nil *Lock) on failure.
func held(l *Lock, err error) (lock.Held, error) {
	if err != nil {
		return nil, err
	}
	return l, nil
}

func (c *Client) acquire(ctx context.Context, name string, opts lock.Options) (*Lock, error) {
	opts, err := opts.WithDefaults()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, opts.Wait)
	defer cancel()

	l, rev, err := c.try(wctx, name, opts, start)
	if err == nil || errors.Is(err, lock.ErrCorrupt) {
		return l, err
	}
	var holder *lock.HolderError
	if opts.Waiting != nil && errors.As(err, &holder) {
		opts.Waiting(holder)
	}
	// Watch for the key's deletion from the revision the attempt read on:
	// a release after that read wakes the loop, however early it came.
	wopts := []clientv3.OpOption{clientv3.WithFilterPut()}
	if rev > 0 { // else the attempt read nothing: watch from now on
		wopts = append(wopts, clientv3.WithRev(rev+1))
	}
	watch := c.cli.Watch(clientv3.WithRequireLeader(wctx), c.Key(name), wopts...)
	return hold.Wait(wctx, opts.RetryInterval, err, watch, false, func() (*Lock, bool, error) {
		l, _, err := c.try(wctx, name, opts, start)
		return l, errors.Is(err, lock.ErrCorrupt), err
	})
}

// state is what an attempt read: the lock key (nil when free), the fence
// counter, the fence key's mod revision and the store's revision.
type state struct {
	kv       *clientv3.GetResponse
	fence    int64
	fenceRev int64
	rev      int64
}

// read gets the lock key and the fence counter at one revision.
func (c *Client) read(ctx context.Context, name string) (state, error) {
	resp, err := c.cli.Txn(ctx).Then(clientv3.OpGet(c.Key(name)), clientv3.OpGet(c.FenceKey(name))).Commit()
	if err != nil {
		return state{}, fmt.Errorf("lock: etcd: read %s: %w", name, err)
	}
	s := state{kv: (*clientv3.GetResponse)(resp.Responses[0].GetResponseRange()), rev: resp.Header.Revision}
	if fk := resp.Responses[1].GetResponseRange().Kvs; len(fk) > 0 {
		s.fenceRev = fk[0].ModRevision
		n, err := strconv.ParseInt(string(fk[0].Value), 10, 64)
		if err != nil || n < 0 {
			return state{}, &lock.CorruptError{
				Node: c.node(), Key: c.FenceKey(name), Fence: true, Holds: cut(fk[0].Value),
			}
		}
		s.fence = n
	}
	return s, nil
}

// try makes one attempt, bounded by opCtx, and returns the revision it
// read at (0 when it read nothing).
func (c *Client) try(opCtx context.Context, name string, opts lock.Options, waitStart time.Time) (*Lock, int64, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(opCtx, opTimeout(opts.TTL))
	defer cancel()
	s, err := c.read(ctx, name)
	if err != nil {
		if errors.Is(err, lock.ErrCorrupt) {
			return nil, 0, err
		}
		return nil, 0, errors.Join(lock.ErrNotObtained, err)
	}
	if len(s.kv.Kvs) > 0 {
		return nil, s.rev, c.refusal(ctx, name, s.kv)
	}
	token := max(s.rev+1, s.fence+1, opts.Floor+1)
	recovered := opts.Floor+1 > max(s.rev+1, s.fence+1)
	grant, err := c.cli.Grant(ctx, leaseTTL(opts.TTL))
	if err != nil {
		return nil, s.rev, errors.Join(lock.ErrNotObtained, fmt.Errorf("lock: etcd: grant for %s: %w", name, err))
	}
	key, fence := c.Key(name), c.FenceKey(name)
	resp, err := c.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0), clientv3.Compare(clientv3.ModRevision(fence), "=", s.fenceRev)).
		Then(clientv3.OpPut(key, opts.Instance, clientv3.WithLease(grant.ID)), clientv3.OpPut(fence, strconv.FormatInt(token, 10))).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil || !resp.Succeeded {
		c.revoke(opCtx, grant.ID)
		if err != nil {
			return nil, s.rev, errors.Join(lock.ErrNotObtained, fmt.Errorf("lock: etcd: acquire %s: %w", name, err))
		}
		// Taken, or the fence moved, since the read.
		return nil, s.rev, c.refusal(ctx, name, (*clientv3.GetResponse)(resp.Responses[0].GetResponseRange()))
	}
	l := &Lock{c: c, name: name, lease: grant.ID, created: resp.Header.Revision, token: token, opts: opts, recovered: recovered}
	l.hold = hold.Start(opCtx, name, opts, c.hooks, start, l.renew)
	if h := c.hooks.Acquired; h != nil {
		h(name, token, time.Since(waitStart))
	}
	return l, s.rev, nil
}

// refusal says who holds name: a *lock.HolderError when the key is there,
// lock.ErrNotObtained alone when it was deleted meanwhile.
func (c *Client) refusal(ctx context.Context, name string, kv *clientv3.GetResponse) error {
	if len(kv.Kvs) == 0 {
		return lock.ErrNotObtained
	}
	k := kv.Kvs[0]
	return &lock.HolderError{Key: name, Owner: owner(k.Lease), Instance: string(k.Value), TTL: c.ttl(ctx, k.Lease)}
}

// ttl is what etcd has left on lease id; 0 when it has none.
func (c *Client) ttl(ctx context.Context, id int64) time.Duration {
	if id == 0 {
		return 0
	}
	r, err := c.cli.TimeToLive(ctx, clientv3.LeaseID(id))
	if err != nil || r.TTL <= 0 {
		return 0
	}
	return time.Duration(r.TTL) * time.Second
}

// revoke ends lease id, best effort: an unrevoked lease expires within its TTL.
func (c *Client) revoke(ctx context.Context, id clientv3.LeaseID) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_, _ = c.cli.Revoke(rctx, id)
}

// owner is the owner value of the holder on etcd lease id.
func owner(id int64) string { return strconv.FormatInt(id, 16) }

// Holder reports the current holder; Owner is "" when the lock is free.
// TTL is what etcd has left on the holder's lease, in whole seconds.
func (c *Client) Holder(ctx context.Context, name string) (lock.HolderInfo, error) {
	resp, err := c.cli.Get(ctx, c.Key(name))
	if err != nil {
		return lock.HolderInfo{}, fmt.Errorf("lock: etcd: holder of %s: %w", name, err)
	}
	if len(resp.Kvs) == 0 {
		return lock.HolderInfo{}, nil
	}
	k := resp.Kvs[0]
	return lock.HolderInfo{Owner: owner(k.Lease), Instance: string(k.Value), TTL: c.ttl(ctx, k.Lease)}, nil
}

// LastToken is the fence key's value: the last token issued for name, 0
// when none since etcd last lost its data.
func (c *Client) LastToken(ctx context.Context, name string) (int64, error) {
	s, err := c.read(ctx, name)
	if err != nil {
		return 0, err
	}
	return s.fence, nil
}

// node names the cluster for errors.
func (c *Client) node() string { return fmt.Sprint(c.cli.Endpoints()) }

// cut is v as shown in an error, at most 64 bytes.
func cut(v []byte) string {
	if len(v) > 64 {
		v = v[:64]
	}
	return strconv.Quote(string(v))
}

// isLeaseGone reports that etcd no longer has the lease.
func isLeaseGone(err error) bool { return errors.Is(err, rpctypes.ErrLeaseNotFound) }
