package redislease

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/outboxd/outboxd/lock"
	"github.com/outboxd/outboxd/lock/internal/hold"
)

var (
	//go:embed scripts/checks.lua
	checksSrc string
	//go:embed scripts/acquire.lua
	acquireSrc string
	//go:embed scripts/raise.lua
	raiseSrc string
	//go:embed scripts/extend.lua
	extendSrc string
	//go:embed scripts/release.lua
	releaseSrc string
	//go:embed scripts/inspect.lua
	inspectSrc string

	// Every script starts with the shared checks, so all of them judge a
	// corrupted key alike.
	acquireScript = redis.NewScript(checksSrc + acquireSrc)
	raiseScript   = redis.NewScript(checksSrc + raiseSrc)
	extendScript  = redis.NewScript(checksSrc + extendSrc)
	releaseScript = redis.NewScript(checksSrc + releaseSrc)
	inspectScript = redis.NewScript(checksSrc + inspectSrc)
)

// drift is Redlock's allowance for clock rate differences between processes.
func drift(ttl time.Duration) time.Duration { return hold.Drift(ttl) }

var _ lock.Lease = (*Client)(nil)

// Client is the Redis lease: it issues locks on one Redis deployment (a
// single node, Sentinel or Cluster through a UniversalClient) or, with
// several independent nodes, in Redlock mode.
type Client struct {
	nodes  []redis.UniversalClient
	quorum int
	prefix string
	hooks  lock.Hooks
}

// Option configures a Client.
type Option func(*Client)

// WithKeyPrefix puts prefix before every key and channel the client uses.
func WithKeyPrefix(prefix string) Option { return func(c *Client) { c.prefix = prefix } }

// WithHooks installs observers.
func WithHooks(h lock.Hooks) Option { return func(c *Client) { c.hooks = h } }

// New returns a Client over one node, or over several independent nodes
// (Redlock: a lock needs len(nodes)/2+1 of them).
func New(nodes []redis.UniversalClient, opts ...Option) *Client {
	if len(nodes) == 0 {
		panic("redislease.New: no Redis nodes")
	}
	c := &Client{nodes: nodes, quorum: len(nodes)/2 + 1}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Key returns the Redis key of the lock name (prefix applied).
func (c *Client) Key(name string) string { return c.prefix + name }

// FenceKey returns the fence counter key: fence:{<lock key>}, in the lock
// key's hash slot whatever the prefix.
func (c *Client) FenceKey(name string) string { return c.prefix + "fence:{" + c.Key(name) + "}" }

// HolderKey is the holder record of lock name: a hash {owner, instance}
// in the fence counter's hash slot, overwritten at each acquisition and
// believed only while its owner is the lock key's value. The lock key's
// value stays the owner alone.
func (c *Client) HolderKey(name string) string { return c.prefix + "holder:{" + c.Key(name) + "}" }

func (c *Client) channel(name string) string { return c.Key(name) + ":released" }

// Acquire waits for the lock until it is obtained, opts.Wait passes or ctx is
// done. On failure the error is lock.ErrNotObtained joined with the cause (the
// wait's context error and the last Redis error, if any). The exception is
// corrupted state (see lock.ErrCorrupt): when it leaves too few nodes for a quorum
// (with one node: at once), Acquire returns without waiting out the rest of
// opts.Wait, since no retry can repair it, and the error matches lock.ErrCorrupt
// but not lock.ErrNotObtained. ctx bounds the wait only: the lock's Context keeps
// ctx's values but not its cancellation, so a holder can finish in-flight work
// after its caller is cancelled. Every acquired lock must be released; its
// watchdog runs until then.
func (c *Client) Acquire(ctx context.Context, name string, opts lock.Options) (lock.Held, error) {
	return held(c.acquire(ctx, name, opts))
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

	// Fast path: a free lock costs one script, no subscription.
	l, final, err := c.try(wctx, name, opts, start)
	if err == nil || final {
		return l, err
	}
	var held *lock.HolderError
	if opts.Waiting != nil && errors.As(err, &held) {
		opts.Waiting(held)
	}
	// Subscribe, then try again at once: a release between the failed try and
	// the subscription is caught by that second try, any later one by the
	// notification.
	wake, closeWake := c.subscribe(wctx, name)
	defer closeWake()
	return hold.Wait(wctx, opts.RetryInterval, err, wake, true, func() (*Lock, bool, error) {
		return c.try(wctx, name, opts, start)
	})
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

type nodeResult struct {
	token     int64
	pttl      int64
	owner     string
	instance  string
	ok        bool
	recovered bool // the floor lifted the counter: this node had lost its state
	err       error
}

// parseAcquire reads acquire.lua's {token, pttl|recovered, owner, instance}.
func parseAcquire(vals []any) nodeResult {
	if len(vals) != 4 {
		return nodeResult{err: fmt.Errorf("lock: acquire script returned %v", vals)}
	}
	text, _ := vals[0].(string)
	token, err := strconv.ParseInt(text, 10, 64)
	if err != nil {
		return nodeResult{err: fmt.Errorf("lock: acquire script returned token %q: %w", text, err)}
	}
	pttl, _ := vals[1].(int64)
	holder, _ := vals[2].(string)
	instance, _ := vals[3].(string)
	return nodeResult{token: token, pttl: pttl, owner: holder, instance: instance, ok: token > 0, recovered: token > 0 && pttl == 1}
}

// attempt folds the nodes' answers to one acquisition attempt.
type attempt struct {
	got       int // nodes where the key is now ours
	token     int64
	recovered bool
	holder    string
	instance  string
	holderTTL int64
	errs      []error // nodes that failed: unreachable, slow, unexpected replies
	corrupt   []error // nodes that failed with a *lock.CorruptError
}

func (a *attempt) add(r nodeResult) {
	var ce *lock.CorruptError
	switch {
	case errors.As(r.err, &ce):
		a.corrupt = append(a.corrupt, r.err)
	case r.err != nil:
		a.errs = append(a.errs, r.err)
	case r.ok:
		a.got++
		a.token = max(a.token, r.token)
		a.recovered = a.recovered || r.recovered
	default:
		if r.pttl >= a.holderTTL {
			a.holderTTL, a.holder, a.instance = r.pttl, r.owner, r.instance
		}
	}
}

// failure is the error of a failed attempt, and whether it is final: the
// nodes with corrupted state alone leave too few for a quorum, so waiting
// cannot help. A final error matches lock.ErrCorrupt and not lock.ErrNotObtained, so
// no caller takes it for "held elsewhere" or "Redis unreachable".
func (c *Client) failure(key string, a attempt) (final bool, err error) {
	if len(a.corrupt) > len(c.nodes)-c.quorum {
		return true, errors.Join(append(a.corrupt, a.errs...)...)
	}
	var base error = &lock.HolderError{Key: key, Owner: a.holder, Instance: a.instance, TTL: time.Duration(a.holderTTL) * time.Millisecond}
	if a.holderTTL <= 0 {
		base = lock.ErrNotObtained
	}
	return false, errors.Join(append(append([]error{base}, a.corrupt...), a.errs...)...)
}

// try makes one attempt on every node; opCtx bounds the Redis calls. final
// reports a failure no retry can cure (see failure).
func (c *Client) try(opCtx context.Context, name string, opts lock.Options, waitStart time.Time) (l *Lock, final bool, err error) {
	owner := uuid.NewString()
	key, fence, holder := c.Key(name), c.FenceKey(name), c.HolderKey(name)
	start := time.Now()

	results := c.on(opCtx, opts.TTL, c.nodes, func(ctx context.Context, n redis.UniversalClient) nodeResult {
		vals, err := acquireScript.Run(ctx, n, []string{key, fence, holder}, owner, opts.TTL.Milliseconds(), opts.Floor, opts.Instance).Slice()
		if err != nil {
			return nodeResult{err: nodeErr(n, key, fence, err)}
		}
		return parseAcquire(vals)
	})
	var a attempt
	var acquired []redis.UniversalClient
	for i, r := range results {
		a.add(r)
		if r.err == nil && r.ok {
			acquired = append(acquired, c.nodes[i])
		}
	}
	validity := opts.TTL - time.Since(start) - drift(opts.TTL)
	if a.got >= c.quorum && validity > 0 && len(c.nodes) > 1 {
		a.got = c.raise(opCtx, opts.TTL, acquired, key, fence, owner, a.token, &a)
	}
	if a.got < c.quorum || validity <= 0 {
		if len(acquired) > 0 {
			// Best effort, error dropped on purpose: we hold less than a
			// quorum, so releaseAll reports "no quorum" almost always, and a
			// lease it could not delete expires within the TTL anyway. The
			// caller gets the failure that matters from c.failure.
			_ = c.releaseAll(context.WithoutCancel(opCtx), opts.TTL, key, owner, c.channel(name))
		}
		final, err := c.failure(key, a)
		return nil, final, err
	}

	l = &Lock{c: c, name: name, key: key, owner: owner, token: a.token, opts: opts, recovered: a.recovered}
	// The lease is trusted until start + TTL - drift - margin on our own clock.
	l.hold = hold.Start(opCtx, name, opts, c.hooks, start, l.renew)
	if h := c.hooks.Acquired; h != nil {
		h(name, a.token, time.Since(waitStart))
	}
	return l, false, nil
}

// nodeName says which Redis an error came from.
func nodeName(n redis.UniversalClient) string {
	switch c := n.(type) {
	case *redis.Client:
		return c.Options().Addr
	case *redis.ClusterClient:
		return "cluster " + strings.Join(c.Options().Addrs, ",")
	}
	return "node"
}

// nodeErr names the node a script error came from; a CORRUPT reply becomes
// a *lock.CorruptError.
func nodeErr(n redis.UniversalClient, key, fence string, err error) error {
	if ce := corruptFrom(err, nodeName(n), key, fence); ce != nil {
		return ce
	}
	return fmt.Errorf("lock: redis %s: %w", nodeName(n), err)
}

// raise lifts the fence counters of nodes (those the owner acquired) to
// token; returns on how many the owner still held the lock. Failures go to a.
func (c *Client) raise(ctx context.Context, ttl time.Duration, nodes []redis.UniversalClient, key, fence, owner string, token int64, a *attempt) int {
	held := 0
	for _, r := range c.on(ctx, ttl, nodes, func(ctx context.Context, n redis.UniversalClient) nodeResult {
		v, err := raiseScript.Run(ctx, n, []string{key, fence}, owner, token).Int64()
		if err != nil {
			return nodeResult{err: nodeErr(n, key, fence, err)}
		}
		return nodeResult{ok: v == 1}
	}) {
		switch {
		case r.err != nil:
			a.add(r)
		case r.ok:
			held++
		}
		// Otherwise the key expired or was taken between the rounds: not ours.
	}
	return held
}

// on runs f on nodes in parallel, each bounded by a per-node timeout that is
// small against the TTL (Redlock), and waits for all.
func (c *Client) on(ctx context.Context, ttl time.Duration, nodes []redis.UniversalClient, f func(context.Context, redis.UniversalClient) nodeResult) []nodeResult {
	timeout := max(ttl/10, 50*time.Millisecond)
	out := make([]nodeResult, len(nodes))
	if len(nodes) == 1 {
		nctx, cancel := context.WithTimeout(ctx, timeout)
		out[0] = f(nctx, nodes[0])
		cancel()
		return out
	}
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() {
			nctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			out[i] = f(nctx, n)
		})
	}
	wg.Wait()
	return out
}

// ownerChecked runs the extend or release script on all nodes and folds the
// answers: nil on a quorum of 1s; lock.ErrOwnedByOther / lock.ErrNotHeld / lock.ErrCorrupt
// when a quorum can no longer be reached because nodes said so (a corrupted
// key is no more ours than a foreign one); otherwise the Redis errors.
func (c *Client) ownerChecked(ctx context.Context, ttl time.Duration, key string, run func(context.Context, redis.UniversalClient) (int64, error)) error {
	var ok, gone, other int
	var errs, corrupt []error
	for _, r := range c.on(ctx, ttl, c.nodes, func(ctx context.Context, n redis.UniversalClient) nodeResult {
		v, err := run(ctx, n)
		if err != nil {
			return nodeResult{err: nodeErr(n, key, "", err)}
		}
		return nodeResult{token: v}
	}) {
		var ce *lock.CorruptError
		switch {
		case errors.As(r.err, &ce):
			corrupt = append(corrupt, r.err)
		case r.err != nil:
			errs = append(errs, r.err)
		case r.token == 1:
			ok++
		case r.token == 0:
			gone++
		default:
			other++
		}
	}
	n := len(c.nodes)
	switch {
	case ok >= c.quorum:
		return nil
	case n-other < c.quorum:
		return joinCause(lock.ErrOwnedByOther, corrupt)
	case n-other-gone < c.quorum:
		return joinCause(lock.ErrNotHeld, corrupt)
	case n-other-gone-len(corrupt) < c.quorum:
		return errors.Join(corrupt...)
	case len(errs) > 0:
		// The corrupted nodes did not cost the quorum (yet): named, not
		// wrapped, so the error does not read as a definite loss.
		if len(corrupt) > 0 {
			return fmt.Errorf("lock: only %d of %d nodes answered: %w (and: %v)", ok, c.quorum, errors.Join(errs...), errors.Join(corrupt...))
		}
		return fmt.Errorf("lock: only %d of %d nodes answered: %w", ok, c.quorum, errors.Join(errs...))
	}
	return lock.ErrNotHeld
}

// joinCause adds the corrupted nodes' errors to a definite answer.
func joinCause(base error, corrupt []error) error {
	if len(corrupt) == 0 {
		return base
	}
	return errors.Join(append([]error{base}, corrupt...)...)
}

func (c *Client) releaseAll(ctx context.Context, ttl time.Duration, key, owner, channel string) error {
	return c.ownerChecked(ctx, ttl, key, func(ctx context.Context, n redis.UniversalClient) (int64, error) {
		return releaseScript.Run(ctx, n, []string{key}, owner, channel).Int64()
	})
}

// view is one node's answer to inspect.lua.
type view struct {
	owner        string
	pttl         int64
	lockProblem  string // what the lock key holds instead of a lease; "" when fine
	counter      int64
	fenceProblem string // what the fence counter holds instead of an integer; "" when fine
	instance     string // the holder's instance; "" when unknown
	err          error
}

// inspect reads the lock on every node, in parallel; views are in node order.
func (c *Client) inspect(ctx context.Context, name string) []view {
	key, fence, holder := c.Key(name), c.FenceKey(name), c.HolderKey(name)
	out := make([]view, len(c.nodes))
	var wg sync.WaitGroup
	for i, n := range c.nodes {
		wg.Go(func() { out[i] = inspectNode(ctx, n, key, fence, holder) })
	}
	wg.Wait()
	return out
}

func inspectNode(ctx context.Context, n redis.UniversalClient, key, fence, holder string) view {
	vals, err := inspectScript.Run(ctx, n, []string{key, fence, holder}).Slice()
	if err != nil {
		return view{err: nodeErr(n, key, fence, err)}
	}
	if len(vals) != 6 {
		return view{err: fmt.Errorf("lock: redis %s: inspect script returned %v", nodeName(n), vals)}
	}
	var v view
	v.owner, _ = vals[0].(string)
	v.pttl, _ = vals[1].(int64)
	v.lockProblem, _ = vals[2].(string)
	counter, _ := vals[3].(string)
	v.fenceProblem, _ = vals[4].(string)
	v.instance, _ = vals[5].(string)
	if v.counter, err = strconv.ParseInt(counter, 10, 64); err != nil {
		return view{err: fmt.Errorf("lock: redis %s: inspect script returned counter %q: %w", nodeName(n), counter, err)}
	}
	return v
}

// Holder reports the current holder, as seen by the first node that
// answers; Owner is "" when the lock is free. When the lock key on any node
// holds something other than a lease (another type, a string without
// expiry) the error matches lock.ErrCorrupt and names key and node.
func (c *Client) Holder(ctx context.Context, name string) (lock.HolderInfo, error) {
	var h lock.HolderInfo
	var errs, corrupt []error
	answered := -1
	for i, v := range c.inspect(ctx, name) {
		switch {
		case v.err != nil:
			errs = append(errs, v.err)
		case v.lockProblem != "":
			corrupt = append(corrupt, &lock.CorruptError{Node: nodeName(c.nodes[i]), Key: c.Key(name), Holds: v.lockProblem})
		case answered < 0:
			answered = i
			h = lock.HolderInfo{Owner: v.owner, Instance: v.instance, TTL: time.Duration(max(v.pttl, 0)) * time.Millisecond}
		}
	}
	switch {
	case len(corrupt) > 0:
		return lock.HolderInfo{}, errors.Join(corrupt...)
	case answered < 0:
		return lock.HolderInfo{}, errors.Join(errs...)
	}
	return h, nil
}

// LastToken reads the fence counter (the last token issued): the highest over
// the nodes that answer; 0 when none was issued since Redis last lost its
// data. When the counter on any node is not an integer Acquire can advance,
// the error matches lock.ErrCorrupt and names key and node.
func (c *Client) LastToken(ctx context.Context, name string) (int64, error) {
	var errs, corrupt []error
	var best int64
	answered := false
	for i, v := range c.inspect(ctx, name) {
		switch {
		case v.err != nil:
			errs = append(errs, v.err)
		case v.fenceProblem != "":
			corrupt = append(corrupt, &lock.CorruptError{Node: nodeName(c.nodes[i]), Key: c.FenceKey(name), Fence: true, Holds: v.fenceProblem})
		default:
			answered = true
			best = max(best, v.counter)
		}
	}
	switch {
	case len(corrupt) > 0:
		return 0, errors.Join(corrupt...)
	case !answered:
		return 0, errors.Join(errs...)
	}
	return best, nil
}

// subscribe listens for releases of name on every node; the returned channel
// receives when one happens. close stops listening and waits for the
// forwarding goroutines. Nodes that cannot subscribe are left to polling.
func (c *Client) subscribe(ctx context.Context, name string) (<-chan struct{}, func()) {
	wake := make(chan struct{}, 1)
	var subs []*redis.PubSub
	for _, n := range c.nodes {
		ps := n.Subscribe(ctx, c.channel(name))
		if _, err := ps.Receive(ctx); err != nil {
			_ = ps.Close()
			continue
		}
		subs = append(subs, ps)
	}
	var wg sync.WaitGroup
	for _, ps := range subs {
		ch := ps.Channel()
		wg.Go(func() {
			for range ch {
				select {
				case wake <- struct{}{}:
				default:
				}
			}
		})
	}
	return wake, func() {
		for _, ps := range subs {
			_ = ps.Close()
		}
		wg.Wait()
	}
}
