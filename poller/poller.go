package poller

import (
	"cmp"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/internal/keys"
	"github.com/outboxd/outboxd/internal/metrics"
	"github.com/outboxd/outboxd/internal/term"
	"github.com/outboxd/outboxd/lock"
	"github.com/outboxd/outboxd/store"
)

// DeliveredTTL is how long an idempotency key says "delivered".
const DeliveredTTL = keys.DeliveredTTL

// Defaults fill the zero fields of Config; config's defaults for the
// poller.* keys are these same values.
const (
	DefaultLockTTL         = 30 * time.Second
	DefaultLockWait        = 5 * time.Second
	DefaultBatchSize       = 500
	DefaultPollInterval    = 100 * time.Millisecond // idle poll ceiling
	DefaultMaxAttempts     = 25
	DefaultClaimTTL        = 60 * time.Second
	DefaultBackoffBase     = time.Second
	DefaultBackoffMax      = time.Hour
	DefaultShutdownTimeout = 25 * time.Second
	DefaultMaxPayloadBytes = 1 << 20  // fits the Kubernetes manifest's 256 Mi with a full batch in flight
	DefaultBatchMaxBytes   = 16 << 20 // likewise
	// DefaultGapWait bounds how long rows wait behind an id a producer took
	// earlier and has not committed (readpath.go). It outlasts the
	// transactions of producers racing under load; a shorter wait lets some
	// of them commit late. Rows behind a short transaction wait for its
	// commit, not for gap_wait; only an id whose transaction stays open
	// longer holds the rows above it this long, once. docs/design.md,
	// "Order when producers race".
	DefaultGapWait = 200 * time.Millisecond
)

// Config tunes the runner. Zero fields get the Default* values.
type Config struct {
	LockTTL         time.Duration // lease of lock:outbox:poller
	Instance        string        // names this replica as the lock's holder (instance_id)
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
	GapWait         time.Duration // longest wait behind an uncommitted earlier id
	LockBackend     string        // where the leases live (lock.backend), for the logs
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
	c.GapWait = cmp.Or(c.GapWait, DefaultGapWait)
	return c
}

// Deps are what the runner acts on.
type Deps struct {
	Store   *store.Store
	Locks   lock.Lease
	Redis   redis.UniversalClient // holds the idempotency keys; nil: Postgres holds them (pgkeys.go)
	Sink    dispatch.Sink
	Log     *slog.Logger
	Metrics *metrics.Metrics
	Tracer  trace.TracerProvider // the batch spans (trace.go); nil: none
}

// Poller is the batch runner. Create with New; Run blocks.
type Poller struct {
	cfg   Config
	store store.ReadPath
	rdb   redis.UniversalClient
	keys  keys.Space
	sink  dispatch.Sink
	log   *slog.Logger
	m     *metrics.Metrics
	spans trace.Tracer
	seat  *term.Seat
	wake  chan struct{}
	hooks hooks // crash points, for tests only

	rewindLogged atomic.Int64  // the term (token) that logged "sequence rewind detected"
	health       fetchHealth   // for FetchFailure
	rd           *reader       // the term's place in the outbox; the lead goroutine's only
	readStats                  // what the read path did, this process; tests read it
	rescanEvery  time.Duration // how often the slow rescan below the cursor starts; tests shorten it
	earlyWrite   time.Duration // see the constant
	maxInherit   int           // see the constant; tests lower it
	maxLastSent  int           // see the constant; tests lower it

	paused pausedRead // the lead goroutine's only (paused.go)

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
	afterLimits   func() // the next fetch's limits taken, the fetch not yet run
	afterWrite    func() // a write of results ended and the reader's note of it is queued
	lateWalk      func() // a late-commit walk started (rescuedLate), off the lead
	lateWalked    func() // a late-commit walk ended
}

// fire calls a crash-window hook if a test set one.
func fire(f func()) {
	if f != nil {
		f()
	}
}

// New returns a runner.
func New(cfg Config, d Deps) *Poller {
	cfg = cfg.withDefaults()
	log := d.Log.With("lock", keys.PollerLock)
	return &Poller{
		cfg: cfg, store: d.Store.ReadPath(), rdb: d.Redis, keys: keys.New(cfg.KeyPrefix), sink: d.Sink, log: log, m: d.Metrics,
		spans: tracer(d.Tracer),
		seat: term.New(keys.PollerLock, term.Options{
			TTL: cfg.LockTTL, Wait: cfg.LockWait, WaitAfterDataLoss: true, ShutdownTimeout: cfg.ShutdownTimeout,
			QueryTimeout: queryTimeout(cfg), Instance: cfg.Instance, LogStandby: true, Backend: cfg.LockBackend,
		}, term.Deps{Locks: d.Locks, Store: d.Store, Log: d.Log, Metrics: d.Metrics}),
		paused: newPausedRead(d.Store.ReadPath(), d.Sink, log),
		wake:   make(chan struct{}, 1), cuts: map[int64]int{}, rescanEvery: rescanEvery, earlyWrite: earlyWrite,
		maxInherit: maxInherit, maxLastSent: maxLastSent,
	}
}

// queryTimeout bounds a Postgres call by the lease: a connection whose
// packets vanish (a network partition) must not hang the leader, and nothing
// a holder waits for is worth more than its lease. pgx closes a connection
// whose context expires; the next call gets a fresh one.
func queryTimeout(c Config) time.Duration { return max(c.LockTTL, 2*time.Second) }

// HeldToken is the fencing token while this runner leads, 0 while it stands by.
func (p *Poller) HeldToken() int64 { return p.seat.Token() }
