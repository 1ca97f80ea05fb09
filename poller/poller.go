// Package poller is the active batch runner: it holds lock:outbox:poller,
// reads due rows, claims their idempotency keys, delivers them and writes the
// results back fenced.
//
// Guarantees:
//   - At most one runner acts at a time as far as Postgres is concerned: all
//     of its writes carry its fencing token, and a write from a runner whose
//     token has been superseded is refused (store.ErrStaleFence), after which
//     that runner steps down.
//   - No event is lost: a row is marked delivered only after its send
//     succeeded; a failed or abandoned send releases its claim (owner-checked)
//     so nothing blocks the retry; a crash at any point costs at most a
//     duplicate delivery, which receivers dedupe by id (Idempotency-Key).
//   - Per-aggregate order: rows of one (aggregate_type, aggregate_id) are sent
//     one after another in id order; the first failure stops that aggregate
//     for the batch, and later rows wait while an earlier one backs off.
//   - Work runs in the lock's context: when the lease is lost, no new send
//     starts.
//   - A crash costs about one lock TTL, never claim_ttl: a claim names the
//     token of the term that made it, and a holder with a higher token takes
//     it over at once (compare-and-set), since the older term's trust
//     deadline has passed by construction. After Redis lost the lock state,
//     the successor first waits one TTL (see lead).
//   - Isolation: nothing about one row stalls the others. A row too large
//     or unsendable as it is (store.Row.Poison) is dead-lettered unloaded; an
//     idempotency key Redis cannot use (WRONGTYPE) or holding a value outboxd
//     did not write fails that row alone, counted and named in last_error;
//     any failure text is stored cleaned (package store). A row that keeps
//     failing dead-letters after MaxAttempts, no sooner than RetryHorizon.
//
// Not guaranteed: exactly-once delivery (a crash between send and mark
// resends), and order across aggregates. Dead-lettered rows do not block
// their aggregate.
package poller

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/internal/keys"
	"github.com/outboxd/outboxd/internal/metrics"
	"github.com/outboxd/outboxd/internal/term"
	"github.com/outboxd/outboxd/lock"
	"github.com/outboxd/outboxd/store"
)

// DeliveredTTL is how long an idempotency key says "delivered".
const DeliveredTTL = 24 * time.Hour

var (
	//go:embed scripts/claim.lua
	claimSrc    string
	claimScript = redis.NewScript(claimSrc)
	//go:embed scripts/finish.lua
	finishSrc    string
	finishScript = redis.NewScript(finishSrc)
	//go:embed scripts/takeover.lua
	takeoverSrc    string
	takeoverScript = redis.NewScript(takeoverSrc)
)

// Defaults fill the zero fields of Config; config's defaults for the
// poller.* keys are these same values.
const (
	DefaultLockTTL         = 30 * time.Second
	DefaultLockWait        = 5 * time.Second
	DefaultBatchSize       = 500
	DefaultPollInterval    = 100 * time.Millisecond // idle poll ceiling (measured: see BENCHMARKS.md)
	DefaultMaxAttempts     = 25
	DefaultClaimTTL        = 60 * time.Second
	DefaultBackoffBase     = time.Second
	DefaultBackoffMax      = time.Hour
	DefaultShutdownTimeout = 25 * time.Second
	DefaultMaxPayloadBytes = 1 << 20  // fits the Kubernetes manifest's 256 Mi with a full batch in flight
	DefaultBatchMaxBytes   = 16 << 20 // likewise
)

// Config tunes the runner. Zero fields get the Default* values.
type Config struct {
	LockTTL         time.Duration // lease of lock:outbox:poller
	LockWait        time.Duration // how long a standby waits per attempt
	BatchSize       int           // rows per batch
	PollInterval    time.Duration // idle poll ceiling
	MaxAttempts     int           // failed attempts before dead-lettering
	ClaimTTL        time.Duration // idempotency claim lifetime
	BackoffBase     time.Duration // retry step after the first failure
	BackoffMax      time.Duration // retry step cap, and Retry-After's
	ShutdownTimeout time.Duration // in-flight work after SIGTERM
	MaxPayloadBytes int64         // a larger row is dead-lettered unloaded
	BatchMaxBytes   int64         // byte budget of one batch
	KeyPrefix       string        // before every Redis key
	Notify          bool          // LISTEN outbox_events for faster wake-ups
}

func (c Config) withDefaults() Config {
	c.LockTTL = cmp.Or(c.LockTTL, DefaultLockTTL)
	c.LockWait = cmp.Or(c.LockWait, DefaultLockWait)
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.PollInterval = cmp.Or(c.PollInterval, DefaultPollInterval)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, DefaultMaxAttempts)
	c.ClaimTTL = cmp.Or(c.ClaimTTL, DefaultClaimTTL)
	c.BackoffBase = cmp.Or(c.BackoffBase, DefaultBackoffBase)
	c.BackoffMax = cmp.Or(c.BackoffMax, DefaultBackoffMax)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, DefaultShutdownTimeout)
	c.MaxPayloadBytes = cmp.Or(c.MaxPayloadBytes, DefaultMaxPayloadBytes)
	c.BatchMaxBytes = cmp.Or(c.BatchMaxBytes, DefaultBatchMaxBytes)
	return c
}

// Deps are what the runner acts on.
type Deps struct {
	Store   *store.Store
	Locks   *lock.Client
	Redis   redis.UniversalClient // holds the idempotency keys
	Sink    dispatch.Sink
	Log     *slog.Logger
	Metrics *metrics.Metrics
}

// Poller is the batch runner. Create with New; Run blocks.
type Poller struct {
	cfg   Config
	store *store.Store
	rdb   redis.UniversalClient
	keys  keys.Space
	sink  dispatch.Sink
	log   *slog.Logger
	m     *metrics.Metrics
	seat  *term.Seat
	wake  chan struct{}
	hooks hooks // crash points, for tests only

	cutMu sync.Mutex
	cuts  map[int64]int // sends of a row cut short by the lease while it was held
}

// hooks run at the protocol's crash windows; tests kill the process there,
// or hold it to widen a window.
type hooks struct {
	afterClaim    func() // claims set, nothing sent
	afterSend     func() // sends done, idempotency keys not finalised
	beforeFinish  func() // results about to be written, beside the next batch
	afterFinalize func() // keys say delivered, Postgres not marked
}

func run(f func()) {
	if f != nil {
		f()
	}
}

// New returns a runner.
func New(cfg Config, d Deps) *Poller {
	cfg = cfg.withDefaults()
	log := d.Log.With("lock", keys.PollerLock)
	return &Poller{
		cfg: cfg, store: d.Store, rdb: d.Redis, keys: keys.New(cfg.KeyPrefix), sink: d.Sink, log: log, m: d.Metrics,
		seat: term.New(keys.PollerLock, term.Options{
			TTL: cfg.LockTTL, Wait: cfg.LockWait, WaitAfterDataLoss: true, ShutdownTimeout: cfg.ShutdownTimeout,
			QueryTimeout: queryTimeout(cfg),
		}, term.Deps{Locks: d.Locks, Store: d.Store, Log: d.Log, Metrics: d.Metrics}),
		wake: make(chan struct{}, 1), cuts: map[int64]int{},
	}
}

// queryTimeout bounds a Postgres call by the lease: a connection whose
// packets vanish (a network partition) must not hang the leader, and nothing
// a holder waits for is worth more than its lease. pgx closes a connection
// whose context expires; the next call gets a fresh one.
func queryTimeout(c Config) time.Duration { return max(c.LockTTL, 2*time.Second) }

// HeldToken is the fencing token while this runner leads, 0 while it stands by.
func (p *Poller) HeldToken() int64 { return p.seat.Token() }

// Run competes for the lock and, while it holds it, relays events. It
// returns nil when ctx is cancelled, after in-flight work has finished (or
// ShutdownTimeout passed) and the lock has been released. Losing the lock or
// an outage of Redis or Postgres never ends Run: it waits and tries again.
func (p *Poller) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	if p.cfg.Notify {
		lctx, cancel := context.WithCancel(ctx)
		defer cancel()
		wg.Go(func() { p.listen(lctx) })
	}
	retry := newBackoff(100*time.Millisecond, 5*time.Second)
	for ctx.Err() == nil {
		err := p.seat.Run(ctx, 0, func(work context.Context, t *term.Term) error { return p.lead(ctx, work, t) })
		switch {
		case ctx.Err() != nil:
		case !errors.Is(err, term.ErrNotAcquired):
			retry.reset()
			if err != nil && !errors.Is(err, store.ErrStaleFence) {
				p.log.Error("stepping down", "error", err)
			}
		case errors.Is(err, lock.ErrCorrupt): // before heldElsewhere: in Redlock mode both can hold
			// Nothing delivers until an operator repairs Redis: say so loudly,
			// and keep checking, so the relay resumes once the key is fixed.
			p.log.Error("lock state corrupted", "error", err)
			sleep(ctx, retry.next())
		case heldElsewhere(err):
		default:
			// Redis or Postgres unreachable: say so, and back off.
			p.log.Warn("lock attempt failed", "error", err)
			sleep(ctx, retry.next())
		}
	}
	return nil
}

// heldElsewhere tells the normal standby case (another replica holds the
// lock) from an outage. Every failed wait ends in a deadline, so only the
// last attempt's HolderError says which it was.
func heldElsewhere(err error) bool {
	var h *lock.HolderError
	return errors.As(err, &h)
}

// lead runs batches while the term holds and ctx is live. Shutdown order:
// stop fetching (ctx) → finish the batch in flight (work, cancelled by the
// term ShutdownTimeout later) → release (the term, when lead returns).
func (p *Poller) lead(ctx, work context.Context, t *term.Term) (err error) {
	idle := time.Duration(0)
	var inflight *finishing // the last batch's results, being written
	defer func() {
		// Every result is written (or has failed) before the term ends.
		switch ferr := inflight.wait(); {
		case ferr == nil:
		case errors.Is(ferr, store.ErrStaleFence):
			err = cmp.Or(err, ferr)
		default:
			t.Log().Error("batch failed", "error", ferr)
		}
	}()
	for {
		if ctx.Err() != nil || work.Err() != nil {
			return nil // "lock lost" is logged on release
		}
		n, more, next, err := p.batch(work, t.Fence(), t.TrustedUntil, inflight)
		inflight = next
		switch {
		case errors.Is(err, store.ErrStaleFence):
			return err
		case work.Err() != nil:
			return nil
		case err != nil:
			t.Log().Error("batch failed", "error", err)
			idle = p.cfg.PollInterval
		case more:
			idle = 0 // more waiting: go again at once
		case n > 0:
			idle = time.Millisecond // a stream: the next rows are due within about a poll
		default:
			// Quiet: back off 1, 2, 4 ... ms up to poll_interval, so a short
			// gap in a stream costs a millisecond or two, not a poll interval.
			idle = min(max(2*idle, time.Millisecond), p.cfg.PollInterval)
		}
		if idle == 0 {
			continue
		}
		timer := time.NewTimer(idle)
		select {
		case <-ctx.Done():
		case <-work.Done():
		case <-p.wake:
			idle = 0
		case <-timer.C:
		}
		timer.Stop()
	}
}

// listen wakes the leader on NOTIFY outbox_events. Polling continues either
// way; this only shortens the wait.
func (p *Poller) listen(ctx context.Context) {
	retry := newBackoff(100*time.Millisecond, 5*time.Second)
	for ctx.Err() == nil {
		err := p.store.Listen(ctx, "outbox_events", func() {
			retry.reset()
			select {
			case p.wake <- struct{}{}:
			default:
			}
		})
		if ctx.Err() == nil {
			p.log.Warn("listen failed", "error", err)
			sleep(ctx, retry.next())
		}
	}
}

// outcome of one row in a batch.
type outcome uint8

const (
	pending   outcome = iota // claimed, not reached (aggregate stopped earlier): unclaim
	sent                     // delivered by us
	duplicate                // Redis said delivered: mark without sending
	foreign                  // a newer holder's claim: leave alone
	failed                   // send failed: unclaim, count the attempt
	refused                  // the idempotency key could not be claimed (wrong type, odd value): count the attempt
	poisoned                 // the row cannot be sent as it is (row.Poison): dead-letter, never claimed
)

type item struct {
	row     store.Row
	outcome outcome
	err     error
}

// finishing is a batch whose results are being written (Redis keys, then
// the fenced Postgres write) while the next batch is fetched, claimed and
// sent: those writes are about a third of a batch's time, and the next
// batch does not need them, as long as it leaves this batch's rows alone
// (store.FetchLimits.Skip) and, if an aggregate stopped here at a row not
// delivered, waits for the write that makes that row back off (otherwise
// the aggregate's later rows would look due and overtake it).
// At most one batch is finishing at a time, so Postgres gets the results
// in batch order.
type finishing struct {
	ids   []int64 // the batch's rows
	stops bool    // an aggregate stopped at a row not delivered
	done  chan struct{}
	err   error
}

// wait returns the write's error once it is done; nil for a nil finishing.
func (f *finishing) wait() error {
	if f == nil {
		return nil
	}
	<-f.done
	return f.err
}

// skip is what the next fetch must leave out while f is being written.
func (f *finishing) skip() []int64 {
	if f == nil {
		return nil
	}
	return f.ids
}

// batch runs one fetch-claim-send cycle and starts writing its results,
// which go on beside the next batch (see finishing); prev is the previous
// batch's, or nil. It returns how many rows it fetched, whether more are due
// at once (a full batch), and its finishing. trusted is the lease's local
// trust deadline: no send starts past it, and none outlives it; the fetch is
// bounded by it too.
func (p *Poller) batch(ctx context.Context, fence store.Fence, trusted func() time.Time, prev *finishing) (int, bool, *finishing, error) {
	start := time.Now()
	if prev != nil && prev.stops {
		if err := prev.wait(); err != nil {
			return 0, false, nil, err
		}
		prev = nil
	}
	qctx, cancel := context.WithDeadline(ctx, trusted())
	rows, err := p.store.FetchDue(qctx, store.FetchLimits{
		Rows: p.cfg.BatchSize, RowBytes: p.cfg.MaxPayloadBytes, Bytes: p.cfg.BatchMaxBytes, Skip: prev.skip(),
	})
	cancel()
	if err != nil || len(rows) == 0 {
		return 0, false, nil, errors.Join(err, prev.wait())
	}
	// A batch the byte budget cut is not "full": the next one follows after
	// the short busy pause, which is nothing beside sending 16 MiB.
	more := len(rows) >= p.cfg.BatchSize
	p.m.BatchSize.Observe(float64(len(rows)))
	items := make([]item, len(rows))
	for i, r := range rows {
		items[i].row = r
		if r.Poison != "" {
			items[i].outcome, items[i].err = poisoned, &dispatch.Error{Err: errors.New(r.Poison), Permanent: true}
		}
	}
	c := claim{token: fence.Token, owner: fence.Owner, batch: strconv.FormatInt(start.UnixNano(), 36)}
	if err := p.claim(ctx, items, c); err != nil {
		return len(rows), more, nil, errors.Join(err, prev.wait())
	}
	run(p.hooks.afterClaim)
	p.deliver(ctx, items, fence.Token, trusted)
	run(p.hooks.afterSend)

	f := &finishing{ids: make([]int64, len(items)), done: make(chan struct{})}
	for i, it := range items {
		// The write needs no payloads: let them go before the next batch
		// loads its own, so at most one batch's bytes are held.
		items[i].row.Payload, items[i].row.Headers = nil, nil
		f.ids[i] = it.row.ID
		switch it.outcome {
		case pending, foreign, failed, refused:
			f.stops = true
		}
	}
	// Results are written even if the lease was lost meanwhile: the fence, not
	// the lease, decides whether they land, and landing them saves duplicates.
	// They go after the previous batch's, and that one's error (a stale
	// fence) is this batch's.
	perr := prev.wait()
	go func() {
		defer close(f.done)
		wctx, cancelW := context.WithTimeout(context.WithoutCancel(ctx), queryTimeout(p.cfg))
		defer cancelW()
		if err := p.finish(wctx, items, c.String(), fence, start); err != nil {
			// Read by the next batch: say whose results these were.
			f.err = fmt.Errorf("writing an earlier batch's results: %w", err)
		}
	}()
	return len(rows), more, f, perr
}

// claim is the value a runner puts on an idempotency key while it delivers
// the row: "claim:<token>:<owner>:<batch>". The token says whose term the
// delivery belongs to, so a later holder can tell an abandoned claim from a
// live one without waiting for its TTL.
type claim struct {
	token int64
	owner string // the lock acquisition's owner value
	batch string // unique per batch within the term
}

func (c claim) String() string {
	return "claim:" + strconv.FormatInt(c.token, 10) + ":" + c.owner + ":" + c.batch
}

// parseClaim reads a claim value; ok is false for anything else. Claims of
// earlier versions ("claim:<token>:<nonce>") parse with an empty owner.
func parseClaim(v string) (c claim, ok bool) {
	rest, ok := strings.CutPrefix(v, "claim:")
	if !ok {
		return c, false
	}
	tok, rest, _ := strings.Cut(rest, ":")
	t, err := strconv.ParseInt(tok, 10, 64)
	if err != nil || t <= 0 {
		return c, false
	}
	c.token = t
	if owner, batch, found := strings.Cut(rest, ":"); found {
		c.owner, c.batch = owner, batch
	} else {
		c.batch = rest
	}
	return c, true
}

// supersedes reports whether our claim may take over other at once: other
// was made under an earlier term, whose lease (and so its trust deadline,
// after which its holder starts no send and writes none) ended before ours
// began; or by an earlier batch of our own term, which has finished. A claim
// of a newer term, or of the same token from another owner, is left alone.
func (c claim) supersedes(other claim) bool {
	return other.token < c.token || (other.token == c.token && other.owner == c.owner && other.batch != c.batch)
}

// claim sets every sendable row's idempotency key to our claim if absent
// (claim.lua, one call per batch; per key in Redis Cluster), and classifies
// the rows by what was there. Claims of an earlier holder are taken over at
// once (one more round trip, only when there are any): a crash costs about
// one lock TTL, never claim_ttl. A key Redis cannot use as a string
// (WRONGTYPE) or holding a value outboxd did not write fails that row alone;
// an outage fails the batch.
func (p *Poller) claim(ctx context.Context, items []item, c claim) error {
	value := c.String()
	ttl := strconv.FormatInt(p.cfg.ClaimTTL.Milliseconds(), 10)
	var idx []int // items claimed, in keys order
	var keys []string
	for i := range items {
		if items[i].outcome != poisoned {
			idx, keys = append(idx, i), append(keys, p.keys.Idempotency(items[i].row.ID))
		}
	}
	found, err := p.evalPerSlot(ctx, claimScript, keys, func(lo, hi int) []any { return []any{value, ttl} })
	if err == nil && len(found) != len(keys) {
		err = fmt.Errorf("claim.lua answered %d values for %d keys", len(found), len(keys))
	}
	if err != nil {
		return fmt.Errorf("poller: claim idempotency keys: %w", err)
	}
	var takeover []int
	var previous []string
	for j, i := range idx {
		var v string
		switch x := found[j].(type) {
		case nil:
			err = redis.Nil
		case string:
			v, err = x, nil
		case error:
			err = x
		default:
			err = fmt.Errorf("unexpected reply %T", x)
		}
		switch {
		case errors.Is(err, redis.Nil), err == nil && v == value:
			// Ours to send. Our own value: the script ran twice on that key
			// (a node answered NOSCRIPT and the pipeline was sent again).
			items[i].outcome = pending
		case err != nil && rowError(err):
			items[i].outcome, items[i].err = refused, fmt.Errorf("idempotency key %s: %w", p.keys.Idempotency(items[i].row.ID), err)
		case err != nil:
			return fmt.Errorf("poller: claim %s: %w", p.keys.Idempotency(items[i].row.ID), err)
		case v == "1":
			items[i].outcome = duplicate
		default:
			other, ok := parseClaim(v)
			switch {
			case !ok:
				items[i].outcome = refused
				items[i].err = fmt.Errorf("idempotency key %s holds %q, which outboxd did not write: delete it to let the event go", p.keys.Idempotency(items[i].row.ID), clip(v, 64))
			case c.supersedes(other):
				takeover, previous = append(takeover, i), append(previous, v)
			default:
				items[i].outcome = foreign
			}
		}
	}
	if len(takeover) == 0 {
		return nil
	}
	return p.takeOver(ctx, items, takeover, previous, value, ttl)
}

// takeOver swaps earlier holders' claims for ours, each only if unchanged
// (compare-and-set), in one pipelined round trip.
func (p *Poller) takeOver(ctx context.Context, items []item, idx []int, previous []string, value, ttl string) error {
	pipe := p.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(idx))
	for j, i := range idx {
		// EVAL, not EVALSHA: this path is rare, and a pipeline cannot fall back on NOSCRIPT.
		cmds[j] = takeoverScript.Eval(ctx, pipe, []string{p.keys.Idempotency(items[i].row.ID)}, previous[j], value, ttl)
	}
	if _, err := pipe.Exec(ctx); err != nil && !rowError(err) {
		return fmt.Errorf("poller: take over claims: %w", err)
	}
	taken := 0
	for j, i := range idx {
		n, err := cmds[j].Int()
		switch {
		case err != nil && rowError(err):
			items[i].outcome, items[i].err = refused, fmt.Errorf("idempotency key %s: %w", p.keys.Idempotency(items[i].row.ID), err)
		case err != nil:
			return fmt.Errorf("poller: take over %s: %w", p.keys.Idempotency(items[i].row.ID), err)
		case n == 1:
			items[i].outcome = pending
			taken++
		case n == 2:
			items[i].outcome = duplicate // its holder finished meanwhile
		default:
			items[i].outcome = foreign // changed under us: look again next batch
		}
	}
	if taken > 0 {
		p.m.ClaimsTakenOver.Add(float64(taken))
		p.log.Info("took over claims of an earlier holder", "claims", taken)
	}
	return nil
}

// rowError: Redis refused one key's command for what the key holds; other
// keys of the pipeline are unaffected. Anything else (I/O, LOADING, OOM) is
// about Redis itself and fails the batch.
func rowError(err error) bool {
	return redis.HasErrorPrefix(err, "WRONGTYPE")
}

// deliver hands what is ours to send to the sink, in id order and in
// chunks of its MaxBatch, and records each row's outcome. An aggregate stops
// at a row it must not pass (a newer holder's claim, a key that failed, a
// failed send): its later rows stay pending, so its order holds. Rows found
// delivered and poison rows do not block their aggregate.
func (p *Poller) deliver(ctx context.Context, items []item, token int64, trusted func() time.Time) {
	type aggKey struct{ t, id string }
	agg := func(i int) aggKey { return aggKey{items[i].row.AggregateType, items[i].row.AggregateID} }
	stopped := map[aggKey]bool{}
	var queue []int // rows to send, id order
	for i := range items {
		switch items[i].outcome {
		case foreign, refused:
			stopped[agg(i)] = true
		case pending:
			if !stopped[agg(i)] {
				queue = append(queue, i)
			}
		}
	}
	limit := p.sink.Capabilities().MaxBatch
	for len(queue) > 0 && ctx.Err() == nil && time.Now().Before(trusted()) {
		var chunk, rest []int
		for _, i := range queue {
			switch {
			case stopped[agg(i)]:
			case limit > 0 && len(chunk) == limit:
				rest = append(rest, i)
			default:
				chunk = append(chunk, i)
			}
		}
		queue = rest
		if len(chunk) == 0 {
			return
		}
		events := make([]dispatch.Event, len(chunk))
		for j, i := range chunk {
			r := items[i].row
			events[j] = dispatch.Event{ID: r.ID, AggregateType: r.AggregateType, AggregateID: r.AggregateID,
				EventType: r.EventType, Payload: r.Payload, Headers: r.Headers, CreatedAt: r.CreatedAt}
		}
		results := p.sink.Send(ctx, dispatch.Batch{Events: events, Token: token, Until: trusted})
		if len(results) != len(chunk) {
			// A sink that breaks its contract: trust none of it; claims are released.
			p.log.Error("sink returned a wrong number of results; nothing marked", "batch_size", len(chunk), "results", len(results))
			return
		}
		for j, i := range chunk {
			if !p.apply(ctx, &items[i], results[j]) {
				stopped[agg(i)] = true
			}
		}
	}
}

// apply records a sink's result on a row; false when its aggregate must
// stop here (anything but a delivery).
func (p *Poller) apply(ctx context.Context, it *item, r dispatch.Result) bool {
	switch r.Outcome {
	case dispatch.Delivered, dispatch.Duplicate:
		it.outcome = sent
		if r.Ref != "" || r.Outcome == dispatch.Duplicate {
			p.log.Debug("sink acknowledged", "outbox_id", it.row.ID, "result", r.Outcome.String(), "ref", r.Ref)
		}
		return true
	case dispatch.Retryable, dispatch.Permanent:
		err := r.Err
		if err == nil {
			err = errors.New("the sink reported a failure without a reason")
		}
		if r.Cut {
			it.outcome, it.err = p.cutShort(ctx, it.row.ID, err)
			return false
		}
		it.outcome, it.err = failed, &dispatch.Error{Err: err, Permanent: r.Outcome == dispatch.Permanent, RetryAfter: r.RetryAfter}
		return false
	default:
		return false // not attempted: stays pending, its claim is released
	}
}

// cutShort decides what a send cut short by the lease's trust deadline
// counts as. If the lease itself is gone, or shutdown ran out of time, the
// cut is ours, not the receiver's: no attempt is counted. If the lease is
// still held, the receiver answered slower than the lease allows; once is
// forgiven (a renewal may have been late), a second time for the same row
// counts as a failed attempt, so a hanging receiver cannot keep a row
// retrying forever without ever dead-lettering.
func (p *Poller) cutShort(ctx context.Context, id int64, err error) (outcome, error) {
	if ctx.Err() != nil {
		p.log.Debug("send abandoned", "outbox_id", id, "error", context.Cause(ctx))
		return pending, nil
	}
	p.m.SendsCut.Inc()
	p.cutMu.Lock()
	if len(p.cuts) > maxTrackedCuts {
		clear(p.cuts)
	}
	p.cuts[id]++
	n := p.cuts[id]
	if n >= 2 {
		delete(p.cuts, id)
	}
	p.cutMu.Unlock()
	p.log.Warn("send cut short by the lease", "outbox_id", id, "times", n, "error", err)
	if n < 2 {
		return pending, nil
	}
	return failed, fmt.Errorf("send cut short by the lock's trust deadline %d times: the receiver answers slower than the lease allows: %w", n, err)
}

// maxTrackedCuts bounds the per-row memory of cut sends.
const maxTrackedCuts = 10000

// finish turns claims into delivered marks or releases them (finish.lua,
// one call per batch; per key in Redis Cluster, whose scripts cannot span
// slots), then writes every outcome to Postgres in one fenced statement.
func (p *Poller) finish(ctx context.Context, items []item, claim string, fence store.Fence, start time.Time) error {
	run(p.hooks.beforeFinish)
	var delivered []int64
	var failures []store.Failure
	var keys []string
	var ops []byte // finish.lua's letter per key
	now := time.Now()
	for _, it := range items {
		switch it.outcome {
		case sent:
			delivered = append(delivered, it.row.ID)
			keys, ops = append(keys, p.keys.Idempotency(it.row.ID)), append(ops, 'd')
		case duplicate:
			delivered = append(delivered, it.row.ID)
		case pending:
			keys, ops = append(keys, p.keys.Idempotency(it.row.ID)), append(ops, 'u')
		case failed:
			keys, ops = append(keys, p.keys.Idempotency(it.row.ID)), append(ops, 'u')
			failures = append(failures, p.failure(it, now))
		case refused, poisoned:
			failures = append(failures, p.failure(it, now))
		}
	}
	if err := p.settleKeys(ctx, keys, ops, claim); err != nil {
		// Not fatal: an unreleased claim is taken over by the next batch, and a
		// missing delivered mark costs at most a duplicate. Postgres is the record.
		p.log.Warn("idempotency keys not updated", "error", err, "batch_size", len(items))
	}
	run(p.hooks.afterFinalize)

	nd, _, err := p.store.Complete(ctx, fence, delivered, failures)
	if err != nil {
		return err
	}
	for _, it := range items {
		switch it.outcome {
		case sent:
			p.m.Dispatched.Inc()
			p.m.DispatchLatency.Observe(now.Sub(it.row.CreatedAt).Seconds())
			p.log.Debug("event delivered", "outbox_id", it.row.ID)
		case duplicate:
			p.m.Duplicates.Inc()
			p.log.Debug("event already delivered, marked", "outbox_id", it.row.ID)
		case failed, refused:
			p.m.DispatchFailures.Inc()
		}
	}
	for _, f := range failures {
		if f.Dead {
			p.m.DeadLettered.Inc()
			p.log.Warn("event dead-lettered", "outbox_id", f.ID, "error", f.Error)
		} else {
			p.log.Debug("delivery failed, will retry", "outbox_id", f.ID, "error", f.Error, "retry_at", f.RetryAt)
		}
	}
	p.m.BatchDuration.Observe(time.Since(start).Seconds())
	p.log.Debug("batch done", "batch_size", len(items), "delivered", nd, "failed", len(failures),
		"duration_ms", time.Since(start).Milliseconds())
	return nil
}

// failure decides retry or dead-letter. The wait after attempt n is drawn
// from [step/2, step], step = backoff_base·2^(n-1) capped at backoff_max:
// jitter spreads retries, and the floor makes max_attempts a minimum time
// before dead-lettering (see RetryHorizon). A receiver's Retry-After is
// honoured up to backoff_max.
func (p *Poller) failure(it item, now time.Time) store.Failure {
	attempts := it.row.Attempts + 1
	f := store.Failure{ID: it.row.ID, Error: it.err.Error()}
	if dispatch.IsPermanent(it.err) || attempts >= p.cfg.MaxAttempts {
		f.Dead = true
		return f
	}
	step := p.step(attempts)
	delay := step/2 + time.Duration(rand.Int64N(int64(step-step/2)+1))
	delay = max(delay, min(dispatch.RetryAfter(it.err), p.cfg.BackoffMax))
	f.RetryAt = now.Add(delay)
	return f
}

// step is the backoff ceiling after the given failed attempt.
func (p *Poller) step(attempts int) time.Duration {
	if shift := attempts - 1; shift < 40 {
		return min(p.cfg.BackoffMax, p.cfg.BackoffBase<<shift)
	}
	return p.cfg.BackoffMax
}

// RetryHorizon is how long a row that keeps failing (retryable errors, no
// Retry-After) survives before it is dead-lettered: at least min, at most
// max, plus the time the attempts themselves take.
func RetryHorizon(cfg Config) (lo, hi time.Duration) {
	p := &Poller{cfg: cfg.withDefaults()}
	for n := 1; n < p.cfg.MaxAttempts; n++ {
		s := p.step(n)
		lo += s / 2
		hi += s
	}
	return lo, hi
}

// settleKeys runs finish.lua over keys with their ops letters.
func (p *Poller) settleKeys(ctx context.Context, keys []string, ops []byte, claim string) error {
	ttl := strconv.FormatInt(DeliveredTTL.Milliseconds(), 10)
	_, err := p.evalPerSlot(ctx, finishScript, keys, func(lo, hi int) []any { return []any{claim, ttl, string(ops[lo:hi])} })
	return err
}

// evalPerSlot runs a per-key batch script over keys, args(lo, hi) giving
// the arguments for keys[lo:hi]: one call for all of them, or one call per
// key (pipelined) in Redis Cluster, whose scripts cannot span hash slots,
// and behind a proxy that refuses a script over several slots (CROSSSLOT:
// the script did not run). It returns the scripts' array replies joined,
// one element per key. If Redis lost its script cache (a restart) the
// scripts are sent whole and run again: finish.lua is idempotent, and a
// second claim.lua on a key finds our own claim, which claim reads as ours.
func (p *Poller) evalPerSlot(ctx context.Context, s *redis.Script, keys []string, args func(lo, hi int) []any) ([]any, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	step := len(keys)
	if _, cluster := p.rdb.(*redis.ClusterClient); cluster {
		step = 1
	}
	exec := func(sha bool) ([]*redis.Cmd, error) {
		pipe := p.rdb.Pipeline()
		var cmds []*redis.Cmd
		for lo := 0; lo < len(keys); lo += step {
			hi := lo + step
			if sha {
				cmds = append(cmds, s.EvalSha(ctx, pipe, keys[lo:hi], args(lo, hi)...))
			} else {
				cmds = append(cmds, s.Eval(ctx, pipe, keys[lo:hi], args(lo, hi)...))
			}
		}
		_, err := pipe.Exec(ctx)
		return cmds, err
	}
	cmds, err := exec(true)
	if redis.HasErrorPrefix(err, "CROSSSLOT") && step > 1 {
		step = 1
		cmds, err = exec(true)
	}
	if redis.HasErrorPrefix(err, "NOSCRIPT") {
		cmds, err = exec(false)
	}
	if err != nil {
		return nil, err
	}
	var out []any
	for _, c := range cmds {
		switch v := c.Val().(type) {
		case []any:
			out = append(out, v...)
		default: // a count
			out = append(out, v)
		}
	}
	return out, nil
}

// clip cuts s to at most n bytes for a message (callers quote it).
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

type backoff struct{ base, cap, cur time.Duration }

func newBackoff(base, cap time.Duration) *backoff { return &backoff{base: base, cap: cap} }
func (b *backoff) reset()                         { b.cur = 0 }
func (b *backoff) next() time.Duration {
	b.cur = min(max(2*b.cur, b.base), b.cap)
	return b.cur/2 + time.Duration(rand.Int64N(int64(b.cur/2)+1))
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
