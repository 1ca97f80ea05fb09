package lock

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
)

var (
	// ErrNotObtained: the lock is held by someone else (or too few nodes
	// answered) and the wait ran out.
	ErrNotObtained = errors.New("lock: not obtained")
	// ErrLost: a held lock can no longer be trusted; the cause of a lock's
	// Context once it is lost.
	ErrLost = errors.New("lock: lost")
	// ErrNotHeld: release or extend found the key gone (expired or flushed).
	ErrNotHeld = errors.New("lock: key gone (expired or flushed)")
	// ErrOwnedByOther: release or extend found the key owned by another holder.
	ErrOwnedByOther = errors.New("lock: owned by another holder")
	// ErrReleased is the cause of a lock's Context after Release.
	ErrReleased = errors.New("lock: released")
)

var (
	//go:embed scripts/acquire.lua
	acquireSrc string
	//go:embed scripts/raise.lua
	raiseSrc string
	//go:embed scripts/extend.lua
	extendSrc string
	//go:embed scripts/release.lua
	releaseSrc string

	acquireScript = redis.NewScript(acquireSrc)
	raiseScript   = redis.NewScript(raiseSrc)
	extendScript  = redis.NewScript(extendSrc)
	releaseScript = redis.NewScript(releaseSrc)
)

// Defaults applied to zero Options fields.
const (
	DefaultWait          = 5 * time.Second
	DefaultRetryInterval = 50 * time.Millisecond
)

// Options configure one acquisition.
type Options struct {
	// TTL of the lease. Required.
	TTL time.Duration
	// Wait bounds Acquire even when ctx has no deadline. Zero means DefaultWait.
	Wait time.Duration
	// RetryInterval between attempts while waiting; a random jitter of up to the
	// same again is added. Zero means DefaultRetryInterval.
	RetryInterval time.Duration
	// RenewInterval of the watchdog. Zero means TTL/3; negative disables the
	// watchdog (the lock then lives for one TTL unless Extend is called).
	RenewInterval time.Duration
	// SafetyMargin is subtracted from the local trust deadline on top of the
	// clock drift. Zero means TTL/10.
	SafetyMargin time.Duration
	// Floor is the highest token already accepted downstream; the issued token
	// is always greater.
	Floor int64
}

func (o Options) withDefaults() (Options, error) {
	if o.TTL <= 0 {
		return o, fmt.Errorf("lock: TTL must be positive, got %s", o.TTL)
	}
	if o.Wait == 0 {
		o.Wait = DefaultWait
	}
	if o.RetryInterval <= 0 {
		o.RetryInterval = DefaultRetryInterval
	}
	if o.RenewInterval == 0 {
		o.RenewInterval = o.TTL / 3
	}
	if o.SafetyMargin <= 0 {
		o.SafetyMargin = o.TTL / 10
	}
	return o, nil
}

// drift is Redlock's allowance for clock rate differences between processes.
func drift(ttl time.Duration) time.Duration { return ttl/100 + 2*time.Millisecond }

// Hooks observe lock events (for metrics). Any field may be nil. They run on
// the lock's goroutines and must not block.
type Hooks struct {
	Acquired    func(name string, token int64, waited time.Duration)
	Released    func(name string)
	Lost        func(name string, cause error)
	RenewFailed func(name string, err error)
}

// Client issues locks on one Redis deployment (a single node, Sentinel or
// Cluster through a UniversalClient) or, with several independent nodes, in
// Redlock mode.
type Client struct {
	nodes  []redis.UniversalClient
	quorum int
	prefix string
	hooks  Hooks
}

// Option configures a Client.
type Option func(*Client)

// WithKeyPrefix puts prefix before every key and channel the client uses.
func WithKeyPrefix(prefix string) Option { return func(c *Client) { c.prefix = prefix } }

// WithHooks installs observers.
func WithHooks(h Hooks) Option { return func(c *Client) { c.hooks = h } }

// New returns a Client over one node, or over several independent nodes
// (Redlock: a lock needs len(nodes)/2+1 of them).
func New(nodes []redis.UniversalClient, opts ...Option) *Client {
	if len(nodes) == 0 {
		panic("lock.New: no Redis nodes")
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

func (c *Client) channel(name string) string { return c.Key(name) + ":released" }

// Acquire waits for the lock until it is obtained, opts.Wait passes or ctx is
// done. On failure the error is ErrNotObtained joined with the cause (the
// wait's context error and the last Redis error, if any). ctx bounds the wait
// only: the lock's Context keeps ctx's values but not its cancellation, so a
// holder can finish in-flight work after its caller is cancelled. Every
// acquired lock must be released; its watchdog runs until then.
func (c *Client) Acquire(ctx context.Context, name string, opts Options) (*Lock, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, opts.Wait)
	defer cancel()

	// Fast path: a free lock costs one script, no subscription.
	l, err := c.try(wctx, name, opts, start)
	if err == nil {
		return l, nil
	}
	// Subscribe, then try again at once: a release between the failed try and
	// the subscription is caught by that second try, any later one by the
	// notification.
	wake, closeWake := c.subscribe(wctx, name)
	defer closeWake()

	lastErr := err // the last attempt's: a *HolderError, or Redis errors; always wraps ErrNotObtained
	for {
		l, err := c.try(wctx, name, opts, start)
		if err == nil {
			return l, nil
		}
		// An attempt cut short by the wait's own end learned nothing: keep
		// what the previous one said (who holds it, or which node failed).
		if wctx.Err() == nil {
			lastErr = err
		}
		jitter := time.Duration(rand.Int64N(int64(opts.RetryInterval) + 1))
		t := time.NewTimer(opts.RetryInterval + jitter)
		select {
		case <-wctx.Done():
			t.Stop()
			return nil, errors.Join(lastErr, context.Cause(wctx))
		case <-wake:
		case <-t.C:
		}
		t.Stop()
	}
}

// TryAcquire makes one attempt and does not wait.
func (c *Client) TryAcquire(ctx context.Context, name string, opts Options) (*Lock, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	return c.try(ctx, name, opts, time.Now())
}

// HolderError tells who holds a lock when an attempt fails.
type HolderError struct {
	Key   string
	Owner string        // the holder's owner value
	TTL   time.Duration // time left on the holder's lease
}

func (e *HolderError) Error() string {
	return fmt.Sprintf("%s is held by owner %s for %s more", e.Key, e.Owner, e.TTL.Round(time.Millisecond))
}

func (e *HolderError) Unwrap() error { return ErrNotObtained }

type nodeResult struct {
	token     int64
	pttl      int64
	owner     string
	ok        bool
	recovered bool // the floor lifted the counter: this node had lost its state
	err       error
}

// try makes one attempt on every node; opCtx bounds the Redis calls.
func (c *Client) try(opCtx context.Context, name string, opts Options, waitStart time.Time) (*Lock, error) {
	owner := uuid.NewString()
	key, fence := c.Key(name), c.FenceKey(name)
	start := time.Now()

	results := c.onAll(opCtx, opts.TTL, func(ctx context.Context, n redis.UniversalClient) nodeResult {
		vals, err := acquireScript.Run(ctx, n, []string{key, fence}, owner, opts.TTL.Milliseconds(), opts.Floor).Slice()
		if err != nil {
			return nodeResult{err: fmt.Errorf("lock: redis %s: %w", nodeName(n), err)}
		}
		if len(vals) != 3 {
			return nodeResult{err: fmt.Errorf("lock: acquire script returned %v", vals)}
		}
		token, _ := vals[0].(int64)
		pttl, _ := vals[1].(int64)
		holder, _ := vals[2].(string)
		return nodeResult{token: token, pttl: pttl, owner: holder, ok: token > 0, recovered: token > 0 && pttl == 1}
	})

	var token, holderTTL int64
	var holder string
	var errs []error
	got, recovered := 0, false
	for _, r := range results {
		switch {
		case r.err != nil:
			errs = append(errs, r.err)
		case r.ok:
			got++
			token = max(token, r.token)
			recovered = recovered || r.recovered
		default:
			if r.pttl >= holderTTL {
				holderTTL, holder = r.pttl, r.owner
			}
		}
	}
	validity := opts.TTL - time.Since(start) - drift(opts.TTL)
	if got >= c.quorum && validity > 0 && len(c.nodes) > 1 {
		got = c.raise(opCtx, opts.TTL, key, fence, owner, token)
	}
	if got < c.quorum || validity <= 0 {
		if got > 0 {
			c.releaseAll(context.WithoutCancel(opCtx), opts.TTL, key, owner, c.channel(name))
		}
		var err error = &HolderError{Key: key, Owner: holder, TTL: time.Duration(holderTTL) * time.Millisecond}
		if holderTTL <= 0 {
			err = ErrNotObtained
		}
		return nil, errors.Join(append([]error{err}, errs...)...)
	}

	l := &Lock{
		c: c, name: name, key: key, owner: owner, token: token, opts: opts, recovered: recovered,
		done: make(chan struct{}),
	}
	// A held lock lives until released or lost, not until the wait's context
	// ends: the holder decides when to stop (finish in-flight work, then Release).
	l.ctx, l.cancel = context.WithCancelCause(context.WithoutCancel(opCtx))
	// The lease is trusted until start + TTL - drift - margin on our own clock.
	l.expiry = time.AfterFunc(l.trustFor(start), l.expire)
	if h := c.hooks.Acquired; h != nil {
		h(name, token, time.Since(waitStart))
	}
	if opts.RenewInterval > 0 {
		go l.watchdog()
	} else {
		close(l.done)
	}
	return l, nil
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

// raise lifts the quorum's fence counters to token; returns on how many nodes
// the owner still held the lock.
func (c *Client) raise(ctx context.Context, ttl time.Duration, key, fence, owner string, token int64) int {
	n := 0
	for _, r := range c.onAll(ctx, ttl, func(ctx context.Context, node redis.UniversalClient) nodeResult {
		v, err := raiseScript.Run(ctx, node, []string{key, fence}, owner, token).Int64()
		return nodeResult{ok: err == nil && v == 1, err: err}
	}) {
		if r.ok {
			n++
		}
	}
	return n
}

// onAll runs f on every node in parallel, each bounded by a per-node timeout
// that is small against the TTL (Redlock), and waits for all.
func (c *Client) onAll(ctx context.Context, ttl time.Duration, f func(context.Context, redis.UniversalClient) nodeResult) []nodeResult {
	timeout := max(ttl/10, 50*time.Millisecond)
	out := make([]nodeResult, len(c.nodes))
	if len(c.nodes) == 1 {
		nctx, cancel := context.WithTimeout(ctx, timeout)
		out[0] = f(nctx, c.nodes[0])
		cancel()
		return out
	}
	var wg sync.WaitGroup
	for i, n := range c.nodes {
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
// answers: nil on a quorum of 1s; ErrOwnedByOther / ErrNotHeld when a quorum
// can no longer be reached because nodes said so; otherwise the Redis errors.
func (c *Client) ownerChecked(ctx context.Context, ttl time.Duration, run func(context.Context, redis.UniversalClient) (int64, error)) error {
	var ok, gone, other int
	var errs []error
	for _, r := range c.onAll(ctx, ttl, func(ctx context.Context, n redis.UniversalClient) nodeResult {
		v, err := run(ctx, n)
		return nodeResult{token: v, err: err}
	}) {
		switch {
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
	switch {
	case ok >= c.quorum:
		return nil
	case len(c.nodes)-other < c.quorum:
		return ErrOwnedByOther
	case len(c.nodes)-other-gone < c.quorum:
		return ErrNotHeld
	case len(errs) > 0:
		return fmt.Errorf("lock: only %d of %d nodes answered: %w", ok, c.quorum, errors.Join(errs...))
	}
	return ErrNotHeld
}

func (c *Client) releaseAll(ctx context.Context, ttl time.Duration, key, owner, channel string) error {
	return c.ownerChecked(ctx, ttl, func(ctx context.Context, n redis.UniversalClient) (int64, error) {
		return releaseScript.Run(ctx, n, []string{key}, owner, channel).Int64()
	})
}

// Holder reports the current holder's owner value and time left, as seen by
// the first node that answers; owner is "" when the lock is free.
func (c *Client) Holder(ctx context.Context, name string) (owner string, ttl time.Duration, err error) {
	var errs []error
	for _, n := range c.nodes {
		pipe := n.Pipeline()
		get := pipe.Get(ctx, c.Key(name))
		pttl := pipe.PTTL(ctx, c.Key(name))
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			errs = append(errs, err)
			continue
		}
		return get.Val(), max(pttl.Val(), 0), nil
	}
	return "", 0, errors.Join(errs...)
}

// LastToken reads the fence counter (the last token issued) from the first
// node that answers; 0 when none was issued since Redis last lost its data.
func (c *Client) LastToken(ctx context.Context, name string) (int64, error) {
	var errs []error
	var best int64
	answered := false
	for _, n := range c.nodes {
		v, err := n.Get(ctx, c.FenceKey(name)).Int64()
		if err != nil && !errors.Is(err, redis.Nil) {
			errs = append(errs, err)
			continue
		}
		answered = true
		best = max(best, v)
	}
	if !answered {
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
