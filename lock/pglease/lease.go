package pglease

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/lock"
	"github.com/outboxd/outboxd/lock/internal/hold"
)

// Channel is where a release is announced (pg_notify, the payload the lock
// name); waiters LISTEN on it.
const Channel = "outboxd_lease_released"

var _ lock.Lease = (*Client)(nil)

// Client is the Postgres lease over one pool. Give it a small pool of its
// own, so renewals never queue behind other work.
type Client struct {
	pool     *pgxpool.Pool
	schema   string
	noListen bool
	hooks    lock.Hooks
	q        queries
}

// Option configures a Client.
type Option func(*Client)

// WithSchema names the schema outbox_leases and outbox_fence are in
// (outboxd's postgres.schema); "" leaves the names unqualified.
func WithSchema(schema string) Option { return func(c *Client) { c.schema = schema } }

// WithoutListen makes waiters poll at RetryInterval instead of listening
// for releases: for a pool behind a transaction pooler, which keeps no
// LISTEN. Releases still notify.
func WithoutListen() Option { return func(c *Client) { c.noListen = true } }

// WithHooks installs observers.
func WithHooks(h lock.Hooks) Option { return func(c *Client) { c.hooks = h } }

// New returns a Client over pool.
func New(pool *pgxpool.Pool, opts ...Option) *Client {
	c := &Client{pool: pool}
	for _, o := range opts {
		o(c)
	}
	c.q = newQueries(c.schema)
	return c
}

// Acquire waits for the lock until it is obtained, opts.Wait passes or ctx
// is done. On failure the error is lock.ErrNotObtained (a *lock.HolderError
// when another owner held it on the last attempt) joined with the wait's
// context error and the last Postgres error, if any. ctx bounds the wait
// only: the lock's Context keeps ctx's values but not its cancellation.
// Every acquired lock must be released.
func (c *Client) Acquire(ctx context.Context, name string, opts lock.Options) (lock.Held, error) {
	return held(c.acquire(ctx, name, opts))
}

// TryAcquire makes one attempt and does not wait. Its errors are Acquire's.
func (c *Client) TryAcquire(ctx context.Context, name string, opts lock.Options) (lock.Held, error) {
	opts, err := opts.WithDefaults()
	if err != nil {
		return nil, err
	}
	return held(c.try(ctx, name, opts, time.Now()))
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

	// Fast path: a free lock costs one statement, no listening connection.
	l, err := c.try(wctx, name, opts, start)
	if err == nil {
		return l, nil
	}
	var holder *lock.HolderError
	if opts.Waiting != nil && errors.As(err, &holder) {
		opts.Waiting(holder)
	}
	// Listen, then try again at once: a release between the failed try and
	// the LISTEN is caught by that second try, any later one by the
	// notification.
	wake, stop := c.listen(wctx, name)
	defer stop()
	return hold.Wait(wctx, opts.RetryInterval, err, wake, true, func() (*Lock, bool, error) {
		l, err := c.try(wctx, name, opts, start)
		return l, false, err
	})
}

// try makes one attempt; opCtx bounds the statement.
func (c *Client) try(opCtx context.Context, name string, opts lock.Options, waitStart time.Time) (*Lock, error) {
	owner := uuid.NewString()
	start := time.Now()
	qctx, cancel := context.WithTimeout(opCtx, opTimeout(opts.TTL))
	defer cancel()
	var r acquireRow
	err := c.pool.QueryRow(qctx, c.q.acquire, pgx.NamedArgs{
		"lock": name, "owner": owner, "instance": nullable(opts.Instance), "floor": opts.Floor, "ttl_ms": opts.TTL.Milliseconds(),
	}).
		Scan(&r.token, &r.recovered, &r.holder, &r.instance, &r.holderTTL)
	if err != nil {
		return nil, errors.Join(lock.ErrNotObtained, fmt.Errorf("lock: postgres: acquire %s: %w", name, err))
	}
	if r.token == nil {
		return nil, r.refusal(name)
	}
	l := &Lock{c: c, name: name, owner: owner, token: *r.token, opts: opts, recovered: r.recovered}
	l.hold = hold.Start(opCtx, name, opts, c.hooks, start, l.renew)
	if h := c.hooks.Acquired; h != nil {
		h(name, l.token, time.Since(waitStart))
	}
	return l, nil
}

// opTimeout bounds one statement: small against the TTL, so a slow
// Postgres costs an attempt, not the lease.
func opTimeout(ttl time.Duration) time.Duration { return max(ttl/3, 100*time.Millisecond) }

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// acquireRow is the acquire statement's answer: the token when obtained,
// else the holder seen.
type acquireRow struct {
	token     *int64
	recovered bool
	holder    *string
	instance  *string
	holderTTL *int64 // milliseconds
}

func (r acquireRow) refusal(name string) error {
	if r.holder == nil || r.holderTTL == nil || *r.holderTTL <= 0 {
		// Taken by an acquisition that committed after this statement's
		// snapshot: who holds it shows on the next attempt.
		return lock.ErrNotObtained
	}
	he := &lock.HolderError{Key: name, Owner: *r.holder, TTL: time.Duration(*r.holderTTL) * time.Millisecond}
	if r.instance != nil {
		he.Instance = *r.instance
	}
	return he
}

// listen returns a channel that receives when a release of name is
// announced, and the func that stops listening and waits for the
// listener. Without LISTEN (WithoutListen, or no connection to be had) the
// channel never receives: the caller polls.
func (c *Client) listen(ctx context.Context, name string) (<-chan struct{}, func()) {
	wake := make(chan struct{}, 1)
	if c.noListen {
		return wake, func() {}
	}
	pc, err := c.pool.Acquire(ctx)
	if err != nil {
		return wake, func() {}
	}
	conn := pc.Hijack() // its own connection: a LISTEN never goes back to the pool
	if _, err := conn.Exec(ctx, "LISTEN "+Channel); err != nil {
		_ = conn.Close(context.Background())
		return wake, func() {}
	}
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			n, err := conn.WaitForNotification(lctx)
			if err != nil {
				return
			}
			if n.Payload != name {
				continue
			}
			select {
			case wake <- struct{}{}:
			default:
			}
		}
	}()
	return wake, func() {
		cancel()
		<-done
		cctx, ccancel := context.WithTimeout(context.Background(), time.Second)
		defer ccancel()
		_ = conn.Close(cctx)
	}
}

// Holder reports the current holder; Owner is "" when the lock is free.
// TTL is what is left on Postgres' clock.
func (c *Client) Holder(ctx context.Context, name string) (lock.HolderInfo, error) {
	var owner, instance *string
	var ttl int64
	err := c.pool.QueryRow(ctx, c.q.holder, pgx.NamedArgs{"lock": name}).Scan(&owner, &instance, &ttl)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return lock.HolderInfo{}, nil
	case err != nil:
		return lock.HolderInfo{}, fmt.Errorf("lock: postgres: holder of %s: %w", name, err)
	}
	h := lock.HolderInfo{Owner: *owner, TTL: time.Duration(ttl) * time.Millisecond}
	if instance != nil {
		h.Instance = *instance
	}
	return h, nil
}

// LastToken is the lease row's token: the last token issued for name, 0
// when none ever was.
func (c *Client) LastToken(ctx context.Context, name string) (int64, error) {
	var token int64
	err := c.pool.QueryRow(ctx, c.q.lastToken, pgx.NamedArgs{"lock": name}).Scan(&token)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("lock: postgres: last token of %s: %w", name, err)
	}
	return token, nil
}

// table qualifies a table name with schema ("" leaves it unqualified).
func table(schema, name string) string {
	if schema == "" {
		return name
	}
	return pgx.Identifier{schema, name}.Sanitize()
}

// replaceTables puts the qualified table names into a statement.
func replaceTables(schema, sql string) string {
	return strings.NewReplacer(
		"{leases}", table(schema, "outbox_leases"),
		"{fence}", table(schema, "outbox_fence"),
	).Replace(sql)
}
