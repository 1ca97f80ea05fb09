// Package reconcile runs cron-scheduled repair and housekeeping under
// lock:reconciliation.
//
// Guarantees:
//   - Every replica schedules; at each fire time the replica that gets the
//     lock runs and the others skip. A fire time runs once across replicas:
//     it is recorded (fenced) in reconcile_runs before any sweep, and a fire
//     time already recorded is skipped, even when clocks differ and a fast
//     sweep released the lock before a slower replica fired.
//   - The 300 s lock is renewed by its watchdog while a sweep runs; sweeps run
//     in the lock's context and stop at the next batch once it is lost. Every
//     write carries the reconciliation token, so a sweep that lost its lock
//     changes nothing after its successor's first write.
//   - Sweeps work in bounded batches with an id cursor: short transactions,
//     no long locks. They never delete or alter pending rows, and the poller's
//     and the reconciler's writes are both guarded by dispatched_at IS NULL,
//     so neither undoes the other.
package reconcile

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode"

	"github.com/redis/go-redis/v9"
	"github.com/robfig/cron/v3"

	"github.com/outboxd/outboxd/internal/keys"
	"github.com/outboxd/outboxd/internal/metrics"
	"github.com/outboxd/outboxd/internal/term"
	"github.com/outboxd/outboxd/lock"
	"github.com/outboxd/outboxd/store"
)

// ErrAlreadyRan: the fire time was reconciled already (by any replica).
var ErrAlreadyRan = errors.New("reconcile: fire time already ran")

// Defaults fill the zero fields of Config; config's defaults for the
// reconcile.* keys are these same values.
const (
	DefaultSchedule  = "*/5 * * * *"
	DefaultLockTTL   = 300 * time.Second
	DefaultLockWait  = 500 * time.Millisecond // a scheduled run skips rather than queue
	DefaultRetention = 7 * 24 * time.Hour
	DefaultBatchSize = 1000
	// queryTimeout bounds each sweep statement: sweeps are batched, so one
	// taking longer means Postgres is in trouble.
	queryTimeout = 30 * time.Second
)

// MinEvery is the shortest "@every" schedule accepted.
const MinEvery = time.Second

// Config tunes the reconciler. Zero fields get the Default* values
// (DeadRetention 0 keeps dead rows; ShutdownTimeout 0 lets a sweep finish).
type Config struct {
	Schedule        string        // cron spec (see ParseSchedule)
	LockTTL         time.Duration // lease of lock:reconciliation, watchdog-renewed
	LockWait        time.Duration // how long a scheduled run waits for the lock
	Retention       time.Duration // delivered rows older than this are purged
	DeadRetention   time.Duration // dead rows older than this are purged; 0 keeps them
	BatchSize       int           // rows per sweep batch
	ShutdownTimeout time.Duration // how long a sweep goes on after shutdown begins
	KeyPrefix       string        // before every Redis key
	Instance        string        // names this replica as the lock's holder (instance_id)
	LockBackend     string        // where the leases live (lock.backend), for the logs
}

func (c Config) withDefaults() Config {
	c.Schedule = cmp.Or(c.Schedule, DefaultSchedule)
	c.LockTTL = cmp.Or(c.LockTTL, DefaultLockTTL)
	c.LockWait = cmp.Or(c.LockWait, DefaultLockWait)
	c.Retention = cmp.Or(c.Retention, DefaultRetention)
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	return c
}

// Deps are what the reconciler acts on.
type Deps struct {
	Store   *store.Store
	Locks   lock.Lease
	Redis   redis.UniversalClient // holds the idempotency keys; nil: Postgres holds them (keys.go)
	Log     *slog.Logger
	Metrics *metrics.Metrics
}

// Reconciler runs sweeps on a schedule or on demand.
type Reconciler struct {
	cfg      Config
	schedule cron.Schedule
	store    store.Reconcile
	rdb      redis.UniversalClient
	keys     keys.Space
	log      *slog.Logger
	m        *metrics.Metrics
	seat     *term.Seat
	hooks    hooks
}

// HeldToken is the fencing token while a run holds the lock, 0 otherwise.
func (r *Reconciler) HeldToken() int64 { return r.seat.Token() }

// hooks are test-only pause points.
type hooks struct {
	beforeMark func(ctx context.Context) // before each sweep-1 write
}

// New validates the schedule and returns a reconciler.
func New(cfg Config, d Deps) (*Reconciler, error) {
	cfg = cfg.withDefaults()
	sched, err := ParseSchedule(cfg.Schedule)
	if err != nil {
		return nil, err
	}
	return &Reconciler{cfg: cfg, schedule: sched, store: d.Store.Reconcile(), rdb: d.Redis, keys: keys.New(cfg.KeyPrefix),
		log: d.Log.With("lock", keys.ReconcileLock), m: d.Metrics,
		seat: term.New(keys.ReconcileLock, term.Options{
			TTL: cfg.LockTTL, Wait: cfg.LockWait, ShutdownTimeout: cfg.ShutdownTimeout, QueryTimeout: queryTimeout,
			Instance: cfg.Instance, Backend: cfg.LockBackend,
		}, term.Deps{Locks: d.Locks, Store: d.Store, Log: d.Log, Metrics: d.Metrics}),
	}, nil
}

// ParseSchedule parses a cron spec: five standard fields or a descriptor
// such as @every 30s or @hourly, optionally prefixed with CRON_TZ=<zone>
// (default UTC, so replicas in different zones agree on fire times).
// "@every d" fires at multiples of d from a fixed origin, not d after
// whenever the process started, for the same reason.
func ParseSchedule(spec string) (cron.Schedule, error) {
	body := spec
	if strings.HasPrefix(spec, "CRON_TZ=") || strings.HasPrefix(spec, "TZ=") {
		// robfig/cron v3.0.1 slices up to the first space after the zone
		// and panics when there is none ("CRON_TZ=UTC", "TZ=0", a tab):
		// split here, and hand it one space.
		i := strings.IndexFunc(spec, unicode.IsSpace)
		if i < 0 || strings.TrimSpace(spec[i:]) == "" {
			return nil, fmt.Errorf("%q names a time zone but no schedule after it (e.g. \"CRON_TZ=Europe/Berlin 0 3 * * *\")", spec)
		}
		body = strings.TrimSpace(spec[i:])
		spec = spec[:i] + " " + body
	} else if !strings.HasPrefix(spec, "@every") {
		spec = "CRON_TZ=UTC " + spec
	}
	if err := checkEvery(body); err != nil {
		return nil, err
	}
	s, err := cron.ParseStandard(spec)
	if err != nil {
		return nil, err
	}
	// A spec such as "0 0 30 2 *" parses but never fires: say so now
	// rather than never reconcile.
	if s.Next(time.Now()).IsZero() {
		return nil, fmt.Errorf("%q never fires", spec)
	}
	if every, ok := s.(cron.ConstantDelaySchedule); ok {
		return alignedEvery(every.Delay), nil
	}
	return s, nil
}

// checkEvery refuses "@every d" with d below MinEvery. cron rounds a
// shorter delay (0s included) up to 1s without a word: the check reads the
// duration as written.
func checkEvery(body string) error {
	rest, ok := strings.CutPrefix(body, "@every")
	if !ok {
		return nil
	}
	if d, err := time.ParseDuration(strings.TrimSpace(rest)); err == nil && d < MinEvery {
		return fmt.Errorf("@every needs at least %s, got %s", MinEvery, d)
	}
	return nil
}

// alignedEvery fires at every multiple of its duration since the epoch.
type alignedEvery time.Duration

func (d alignedEvery) Next(t time.Time) time.Time {
	return t.Truncate(time.Duration(d)).Add(time.Duration(d))
}

// Summary is what one run did and found.
type Summary struct {
	FireTime        time.Time `json:"fire_time"`
	FencingToken    int64     `json:"fencing_token"`
	MarkedFromRedis int64     `json:"marked_from_redis"`
	PurgedDelivered int64     `json:"purged_delivered"`
	PurgedDead      int64     `json:"purged_dead"`
	// PurgedKeys counts the expired idempotency keys deleted from Postgres
	// (idempotency.store: postgres; Redis expires its own).
	PurgedKeys        int64         `json:"purged_idempotency_keys,omitempty"`
	Pending           int64         `json:"pending"`
	OldestPendingAge  float64       `json:"oldest_pending_age_seconds"`
	Dead              int64         `json:"dead"`
	PendingByAttempts map[int]int64 `json:"pending_by_attempts"`
	DurationMS        int64         `json:"duration_ms"`
}

// Run schedules sweeps until ctx is cancelled, then waits for a running
// sweep to finish. Overlapping runs are skipped and a panic is recovered.
func (r *Reconciler) Run(ctx context.Context) error {
	logger := cronLogger{r.log}
	c := cron.New(cron.WithLogger(logger), cron.WithChain(cron.Recover(logger), cron.SkipIfStillRunning(logger)))
	var id cron.EntryID
	id = c.Schedule(r.schedule, cron.FuncJob(func() {
		fire := c.Entry(id).Prev // the scheduled time, identical on every replica
		r.fire(ctx, fire)
	}))
	c.Start()
	r.log.Info("reconciliation scheduled", "schedule", r.cfg.Schedule, "next", c.Entry(id).Next)
	<-ctx.Done()
	<-c.Stop().Done()
	return nil
}

func (r *Reconciler) fire(ctx context.Context, fireTime time.Time) {
	if ctx.Err() != nil {
		return
	}
	sum, err := r.RunOnce(ctx, fireTime, r.cfg.LockWait)
	switch {
	case err == nil:
		r.m.ReconcileRuns.WithLabelValues("ok").Inc()
		r.logSummary(sum)
	case errors.Is(err, ErrAlreadyRan):
		r.m.ReconcileRuns.WithLabelValues("skipped").Inc()
		r.log.Info("reconcile skipped: fire time already ran", "fire_time", fireTime)
	case lock.HeldElsewhere(err): // not ErrNotObtained: a Redis outage is a failure, not a skip
		r.m.ReconcileRuns.WithLabelValues("skipped").Inc()
		r.log.Info("reconcile skipped: lock held elsewhere", "fire_time", fireTime, "error", err)
	default:
		r.m.ReconcileRuns.WithLabelValues("failed").Inc()
		r.log.Error("reconcile failed", "fire_time", fireTime, "error", err)
	}
}

func (r *Reconciler) logSummary(s Summary) {
	r.log.Info("reconcile finished", "fire_time", s.FireTime, "fencing_token", s.FencingToken,
		"marked_from_redis", s.MarkedFromRedis, "purged_delivered", s.PurgedDelivered, "purged_dead", s.PurgedDead,
		"pending", s.Pending, "oldest_pending_age_seconds", s.OldestPendingAge, "dead", s.Dead,
		"pending_by_attempts", s.PendingByAttempts, "duration_ms", s.DurationMS)
}

// RunOnce takes the lock (waiting up to wait), records fireTime and runs the
// sweeps. It returns ErrAlreadyRan when fireTime was done already, and an
// error wrapping lock.ErrNotObtained (a *lock.HolderError says who holds it)
// when the lock stays held elsewhere.
func (r *Reconciler) RunOnce(ctx context.Context, fireTime time.Time, wait time.Duration) (Summary, error) {
	start := time.Now()
	fireTime = fireTime.UTC().Truncate(time.Microsecond) // Postgres' precision
	sum := Summary{FireTime: fireTime}
	qctx, cancel := context.WithTimeout(ctx, queryTimeout)
	done, err := r.store.RunDone(qctx, fireTime)
	cancel()
	if err != nil || done {
		if done {
			err = ErrAlreadyRan
		}
		return sum, err
	}
	err = r.seat.Run(ctx, wait, func(ctx context.Context, t *term.Term) error {
		sum.FencingToken = t.Token()
		bctx, cancelB := context.WithTimeout(ctx, queryTimeout)
		started, err := r.store.BeginRun(bctx, t.Fence(), fireTime)
		cancelB()
		if err != nil {
			return err
		}
		if !started {
			return ErrAlreadyRan
		}
		if err := r.sweep(ctx, t.Fence(), &sum); err != nil {
			if ctx.Err() != nil {
				err = errors.Join(err, context.Cause(ctx)) // "lock lost" is logged on release
			}
			return err
		}
		sum.DurationMS = time.Since(start).Milliseconds()
		fctx, cancelF := writeCtx(ctx)
		defer cancelF()
		return r.store.FinishRun(fctx, t.Fence(), store.Run{FireTime: fireTime, Summary: sum})
	})
	return sum, err
}

// sweep runs the three sweeps in order, each in bounded batches.
func (r *Reconciler) sweep(ctx context.Context, fence store.Fence, sum *Summary) error {
	var err error
	if sum.MarkedFromRedis, err = r.markFromRedis(ctx, fence); err != nil {
		return fmt.Errorf("reconcile: mark from redis: %w", err)
	}
	if sum.PurgedDelivered, err = r.purge(ctx, fence, store.PurgeDelivered, r.cfg.Retention); err != nil {
		return fmt.Errorf("reconcile: purge delivered: %w", err)
	}
	if r.cfg.DeadRetention > 0 {
		if sum.PurgedDead, err = r.purge(ctx, fence, store.PurgeDead, r.cfg.DeadRetention); err != nil {
			return fmt.Errorf("reconcile: purge dead: %w", err)
		}
	}
	if sum.PurgedKeys, err = r.purgeKeys(ctx, fence); err != nil {
		return fmt.Errorf("reconcile: purge idempotency keys: %w", err)
	}
	sctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	st, err := r.store.Stats(sctx)
	if err != nil {
		return err
	}
	sum.Pending, sum.OldestPendingAge, sum.Dead = st.Pending, st.OldestPendingAge, st.Dead
	if sum.PendingByAttempts, err = r.store.PendingByAttempts(sctx); err != nil {
		return err
	}
	r.m.SetBacklog(st.Pending, st.OldestPendingAge, st.Dead)
	return nil
}

// writeCtx detaches a fenced write from the lock's context: the fence, not
// the lease, decides whether it lands (a stale sweep's write is refused).
func writeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), queryTimeout)
}

// markFromRedis repairs the crash window between "key says delivered" and
// "Postgres marked": pending rows whose idempotency key holds their own
// delivered mark are marked delivered without being sent again. The rule is
// the poller's (keys.Judge, over the same fingerprint: the payload and
// headers digest computed in Postgres, store.Reconcile.ContentDigests): a mark left
// by an earlier row with the same id, or one of the earlier format that
// does not name the payload, marks nothing (the poller takes it over and
// sends the row), and a bare "1" of an earlier version marks its row only
// if it was written after the row was created.
func (r *Reconciler) markFromRedis(ctx context.Context, fence store.Fence) (int64, error) {
	var cursor, marked int64
	floor, err := r.sweepFloor(ctx)
	if err != nil {
		return 0, err
	}
	for {
		if err := ctx.Err(); err != nil {
			return marked, context.Cause(ctx)
		}
		rows, err := r.pendingRows(ctx, floor, cursor)
		if err != nil || len(rows) == 0 {
			return marked, err
		}
		cursor = rows[len(rows)-1].ID
		n, err := r.markBatch(ctx, fence, rows)
		if err != nil {
			return marked, err
		}
		marked += n
		if len(rows) < r.cfg.BatchSize {
			return marked, nil
		}
	}
}

// sweepFloor reads the sweep's floor, once a sweep: see
// store.Reconcile.PendingRowsFrom.
func (r *Reconciler) sweepFloor(ctx context.Context) (*int64, error) {
	fctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	return r.store.SweepFloor(fctx)
}

// pendingRows reads the next batch of pending rows after cursor.
func (r *Reconciler) pendingRows(ctx context.Context, floor *int64, cursor int64) ([]store.Pending, error) {
	rctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	return r.store.PendingRowsFrom(rctx, store.PendingPage{Floor: floor, After: cursor, Limit: r.cfg.BatchSize})
}

// markBatch marks delivered the rows of one batch whose keys hold their
// own delivered mark, and reports how many it marked.
func (r *Reconciler) markBatch(ctx context.Context, fence store.Fence, rows []store.Pending) (int64, error) {
	marks, err := r.readMarks(ctx, rows)
	if err != nil {
		return 0, err
	}
	delivered, foreign := judgeMarks(rows, marks, time.Now())
	if foreign > 0 {
		// The poller counts and reports these when it claims the rows.
		r.log.Debug("pending rows whose keys hold a mark that is not theirs: left to the poller", "foreign_keys", foreign)
	}
	if len(delivered) == 0 {
		return 0, nil
	}
	return r.markDelivered(ctx, fence, delivered)
}

// rowMarks is what a batch's idempotency keys hold, row by row: the values
// (as mget reads them), the PTTL of each bare "1" (legacyAges), and the
// payload-and-headers digests of the rows whose key names one (contents).
type rowMarks struct {
	vals     []string
	pttls    []time.Duration
	contents map[int64]keys.Content
}

// readMarks reads the rows' idempotency keys and what judging them needs.
func (r *Reconciler) readMarks(ctx context.Context, rows []store.Pending) (rowMarks, error) {
	names := make([]string, len(rows))
	for i, row := range rows {
		names[i] = r.keys.Idempotency(row.ID)
	}
	var m rowMarks
	var err error
	if r.rdb == nil {
		m.vals, m.pttls, err = r.pgMarks(ctx, rows)
	} else if m.vals, err = mget(ctx, r.rdb, names); err == nil {
		m.pttls, err = legacyAges(ctx, r.rdb, names, m.vals)
	}
	if err != nil {
		return m, err
	}
	m.contents, err = r.contents(ctx, rows, m.vals)
	return m, err
}

// judgeMarks applies keys.Judge to each row holding a mark: delivered are
// the rows whose key holds their own delivered mark; foreign counts the
// marks of other rows and those that do not name the payload.
func judgeMarks(rows []store.Pending, m rowMarks, now time.Time) (delivered []store.Delivered, foreign int) {
	for i, row := range rows {
		if m.vals[i] == "" || !row.Finite {
			continue
		}
		content, ok := m.contents[row.ID]
		if !ok && m.vals[i] != keys.LegacyDelivered {
			continue // not a mark, or the row is gone
		}
		fp := keys.Fingerprint(row.CreatedAt, row.AggregateType, row.AggregateID, row.EventType, content)
		switch keys.Judge(m.vals[i], m.pttls[i], fp, row.CreatedAt, now) {
		case keys.ThisRow:
			delivered = append(delivered, store.Delivered{ID: row.ID, CreatedAt: row.CreatedAt})
		case keys.OtherRow, keys.Unnamed:
			foreign++
		}
	}
	return delivered, foreign
}

// markDelivered marks the rows delivered with a fenced write and counts
// them.
func (r *Reconciler) markDelivered(ctx context.Context, fence store.Fence, delivered []store.Delivered) (int64, error) {
	if r.hooks.beforeMark != nil {
		r.hooks.beforeMark(ctx)
	}
	wctx, cancel := writeCtx(ctx)
	defer cancel()
	n, err := r.store.MarkDelivered(wctx, fence, delivered)
	if err != nil {
		return 0, err
	}
	r.m.ReconcileSwept.WithLabelValues("marked").Add(float64(n))
	return n, nil
}

// contents reads the payload-and-headers digest (keys.Content) of the
// rows whose key holds a delivered mark "1:<fingerprint>" (vals as mget
// read them), computed in Postgres: their fingerprints need it, and only
// rows in the crash window between the key and the Postgres mark, or rows
// whose ids came round again, have one.
func (r *Reconciler) contents(ctx context.Context, rows []store.Pending, vals []string) (map[int64]keys.Content, error) {
	var ids []int64
	for i, row := range rows {
		if row.Finite && strings.HasPrefix(vals[i], keys.LegacyDelivered+":") {
			ids = append(ids, row.ID)
		}
	}
	if len(ids) == 0 {
		return nil, nil
	}
	qctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	digests, err := r.store.ContentDigests(qctx, ids)
	if err != nil {
		return nil, err
	}
	out := make(map[int64]keys.Content, len(digests))
	for id, d := range digests {
		out[id] = keys.Content(d)
	}
	return out, nil
}

// mget reads keys one slot-safe GET each, pipelined (MGET would cross hash
// slots in Cluster mode). A key Redis cannot read as a string (WRONGTYPE)
// reads as absent: one odd key must not stop the sweep, and the poller
// reports it on the row itself.
func mget(ctx context.Context, rdb redis.UniversalClient, keys []string) ([]string, error) {
	pipe := rdb.Pipeline()
	cmds := make([]*redis.StringCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.Get(ctx, k)
	}
	_, _ = pipe.Exec(ctx) // errors are read per command below
	out := make([]string, len(keys))
	for i, c := range cmds {
		switch err := c.Err(); {
		case err == nil:
			out[i] = c.Val()
		case errors.Is(err, redis.Nil), redis.HasErrorPrefix(err, "WRONGTYPE"):
		default:
			return nil, err
		}
	}
	return out, nil
}

// legacyAges reads the PTTL of the keys that hold a bare "1" (vals as mget
// read them), pipelined; -1 for every other key. Only the upgrade window
// has any.
func legacyAges(ctx context.Context, rdb redis.UniversalClient, names, vals []string) ([]time.Duration, error) {
	out := make([]time.Duration, len(names))
	pipe := rdb.Pipeline()
	cmds := make([]*redis.DurationCmd, len(names))
	n := 0
	for i, v := range vals {
		out[i] = -1
		if v == keys.LegacyDelivered {
			cmds[i] = pipe.PTTL(ctx, names[i])
			n++
		}
	}
	if n == 0 {
		return out, nil
	}
	_, _ = pipe.Exec(ctx) // errors are read per command below
	for i, c := range cmds {
		if c == nil {
			continue
		}
		if err := c.Err(); err != nil {
			return nil, err
		}
		out[i] = c.Val() // go-redis keeps -1 (no TTL) and -2 (no key) as they are
	}
	return out, nil
}

// purge deletes kind's rows older than age (on Postgres's clock: see
// store.Reconcile.Purge) in batches.
func (r *Reconciler) purge(ctx context.Context, fence store.Fence, kind store.PurgeKind, age time.Duration) (int64, error) {
	label := map[store.PurgeKind]string{store.PurgeDelivered: "purged", store.PurgeDead: "purged_dead"}[kind]
	var cursor store.PurgeCursor
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return total, context.Cause(ctx)
		}
		wctx, cancel := writeCtx(ctx)
		purged, err := r.store.Purge(wctx, fence, store.PurgeBatch{Kind: kind, Age: age, After: cursor, Limit: r.cfg.BatchSize})
		cancel()
		if err != nil {
			return total, err
		}
		n := purged.Rows
		total += n
		r.m.ReconcileSwept.WithLabelValues(label).Add(float64(n))
		if n < int64(r.cfg.BatchSize) {
			return total, nil
		}
		cursor = purged.Next
	}
}

// cronLogger adapts slog to cron.Logger.
type cronLogger struct{ l *slog.Logger }

func (c cronLogger) Info(msg string, kv ...any) { c.l.Debug("cron: "+msg, kv...) }
func (c cronLogger) Error(err error, msg string, kv ...any) {
	c.l.Error("cron: "+msg, append(kv, "error", err)...)
}
