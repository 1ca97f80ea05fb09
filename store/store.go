// Package store is outboxd's Postgres side: the pool, the poller's and the
// reconciler's queries, and fenced writes. Enqueue and Event are the
// producer package's, kept here for producers that import store.
//
// Fencing guarantee: every write the poller or reconciler makes to outbox runs
// in one statement (one transaction) that first upserts the lock's
// outbox_fence row. If the stored token is higher than the writer's, the write
// changes nothing and returns ErrStaleFence; otherwise the stored token is
// raised to the writer's and the write proceeds while the fence row stays
// locked. Writers of one lock therefore serialise on that row, and a paused
// ex-holder can never overwrite what a newer holder did.
package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/producer"
)

// ErrStaleFence: a fenced write carried a token lower than one Postgres has
// already accepted for that lock. The writer is no longer the holder.
var ErrStaleFence = errors.New("store: stale fencing token")

// ErrNotMigrated: outboxd's tables are missing from the database.
var ErrNotMigrated = errors.New("store: outboxd's tables are missing: run `outboxd migrate`")

// wrap names the operation and, when the schema is missing, says what to do.
func wrap(op string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
		return fmt.Errorf("%w (%s): %w", ErrNotMigrated, op, err)
	}
	return fmt.Errorf("store: %s: %w", op, err)
}

// Store owns the pool and what every caller shares: the session checks,
// the notify trigger and the fence a term claims (ClaimFence,
// FenceToken). Its queries are split by who runs them, each a view over
// the same pool: ReadPath (the poller), Reconcile (the reconciler) and Ops
// (the operators' commands, the HTTP API and the daemon's status). A
// fenced write takes its Fence second and one value after it; a call of
// more than two values takes a struct.
type Store struct{ *core }

// ReadPath is the poller's queries: the read, the cursor, the late-commit
// checks, the pause set it applies and the batch outcomes it writes.
type ReadPath struct{ *core }

// Reconcile is the reconciler's queries: its runs, the sweep over pending
// rows, the purge, and the dead rows and pauses it changes under its lock.
type Reconcile struct{ *core }

// Ops is what operators and the daemon's status read: dead rows and their
// history, the backlog, the pauses, the replicas and the fence tokens.
type Ops struct{ *core }

// ReadPath returns the poller's queries over s's pool (none for a nil
// s: a part built without a store fails only when it queries).
func (s *Store) ReadPath() ReadPath {
	if s == nil {
		return ReadPath{}
	}
	return ReadPath{s.core}
}

// Reconcile returns the reconciler's queries over s's pool.
func (s *Store) Reconcile() Reconcile {
	if s == nil {
		return Reconcile{}
	}
	return Reconcile{s.core}
}

// Ops returns the operators' queries over s's pool.
func (s *Store) Ops() Ops {
	if s == nil {
		return Ops{}
	}
	return Ops{s.core}
}

// core is the pool the views share; its methods are the helpers they run.
type core struct {
	pool *pgxpool.Pool
	// db runs the statements: pool, or behind a transaction pooler a
	// perTx over it.
	db db
	// readRows is how many rows the last Read returned: the next one's
	// first guess (readCap).
	readRows atomic.Int64
	// want are the session settings the statements rely on, and schema
	// the one outboxd's objects are in ("" for the server's search_path):
	// CheckSession verifies both.
	want   map[string]string
	schema string
}

// Open creates a pool for dsn. It does not wait for Postgres to be reachable:
// callers retry their queries.
func Open(ctx context.Context, dsn string, opts ...Option) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("store: parse postgres.dsn: %w", err)
	}
	return OpenConfig(ctx, cfg, opts...)
}

// OpenConfig creates a pool from a parsed config (tracers, pool sizes).
//
// Its sessions plan prepared statements once (plan_cache_mode =
// force_generic_plan, unless the config sets it): the relay's read (read.sql)
// is a large statement whose planning cost several times its execution
// when planned per call, and every statement here is written so that its
// generic plan is the right one (lookups by id are = ANY (ARRAY(...))).
//
// A generic plan is kept for the session's life, and it is made from the
// table's size when the statement is first run: on a new (or never
// analyzed, autovacuum off) outbox that is an empty table, where a
// sequential scan is the cheapest way to find rows by id. Kept while the
// table grows, that plan reads every row of the table in each read and each
// batch write (a held snapshot's history included), so the relay's
// sessions never plan sequential scans of their own (enable_seqscan = off,
// unless the config sets it): every statement here has an index for its
// rows, and with the scan penalised the plan uses it whatever the
// estimates.
//
// And they never JIT-compile (jit = off, unless the config sets it): the
// read's estimated cost grows with the pending rows, and past
// jit_above_cost Postgres spends many times longer compiling a read than
// running it.
//
// Nor do they start parallel workers (max_parallel_workers_per_gather = 0,
// unless the config sets it): each statement here reads a bounded set of
// rows through an index, and the conditions written opaquely (see
// backingOff) are estimated at half the table, which makes the backlog
// count a parallel bitmap scan that starts two workers on every scrape,
// even to count no rows.
//
// These are startup parameters of each session; behind a transaction
// pooler (WithTransactionPooler) they are set for each transaction instead
// (perTx), with the schema's search_path: the role needs no settings.
func OpenConfig(ctx context.Context, cfg *pgxpool.Config, opts ...Option) (*Store, error) {
	o := Resolve(opts)
	want := configure(o, cfg.ConnConfig)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	st := &Store{&core{pool: pool, db: pool, want: want, schema: o.Schema}}
	if o.TransactionPooler {
		st.db = newPerTx(pool, plannerSettings, o.Schema)
	}
	return st, nil
}

// Pool returns the underlying pool.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Close closes the pool.
func (s *Store) Close() { s.pool.Close() }

// Ping checks that Postgres answers.
func (s *Store) Ping(ctx context.Context) error { return s.pool.Ping(ctx) }

// Event is what a producer writes (producer.Event).
type Event = producer.Event

// Enqueue writes events inside the caller's transaction (producer.Enqueue,
// which a producer imports on its own).
func Enqueue(ctx context.Context, tx pgx.Tx, events ...Event) error {
	return producer.Enqueue(ctx, tx, events...)
}

// EnqueueIn is Enqueue into the outbox of schema (outboxd's
// postgres.schema): producer.EnqueueIn.
func EnqueueIn(ctx context.Context, tx pgx.Tx, schema string, events ...Event) error {
	return producer.EnqueueIn(ctx, tx, schema, events...)
}

// Row is an outbox row as the poller sees it.
type Row struct {
	ID            int64
	AggregateType string
	AggregateID   string
	EventType     string
	Payload       json.RawMessage
	Headers       json.RawMessage
	CreatedAt     time.Time
	Attempts      int
	// Size is the row's payload, headers and text columns in bytes, as
	// Postgres holds them uncompressed.
	Size int64
	// Poison says why the row cannot be delivered as it is (too large, an
	// infinite created_at); such a row is returned without its payload and
	// headers, to be dead-lettered with this reason.
	Poison string
}

// FetchLimits bound one fetch in rows and bytes, so a batch's memory does
// not grow with what producers write.
type FetchLimits struct {
	Rows     int   // at most this many rows
	RowBytes int64 // a larger row comes back without payload and headers, Poison set; 0 = no limit
	Bytes    int64 // rows are returned while their total Size stays within this (the first always); 0 = no limit
	// Skip are rows not to return although they look due: those of batches
	// still being sent or written. Nil skips none.
	Skip []int64
	// Busy are aggregates none of whose rows may be returned: their earlier
	// rows are still being sent. Nil skips none.
	Busy []Aggregate
}

// maxRowBytes is the largest per-row limit a read accepts: a loaded row's
// size is summed as int4.
const maxRowBytes = math.MaxInt32

// Listen holds one connection in LISTEN channel and calls fn for each
// notification until ctx is done or the connection fails.
func (s ReadPath) Listen(ctx context.Context, channel string, fn func()) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("store: listen: %w", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return fmt.Errorf("store: listen: %w", err)
	}
	defer func() {
		// The connection goes back to the pool: stop listening on it.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		if _, err := conn.Exec(uctx, "UNLISTEN *"); err != nil {
			conn.Conn().Close(uctx)
		}
	}()
	for {
		if _, err := conn.Conn().WaitForNotification(ctx); err != nil {
			return fmt.Errorf("store: listen: %w", err)
		}
		fn()
	}
}

// SetNotifyTrigger installs or removes the insert trigger that NOTIFYs
// outbox_events once per inserting statement (poller.notify). It changes
// nothing when the trigger is already as asked, so replicas starting up do
// not take the table lock that DDL needs. Changing it needs the table's
// owner: a relay role with DML rights only gets an error saying so, and
// its poller polls.
func (s *Store) SetNotifyTrigger(ctx context.Context, on bool) error {
	var exists bool
	err := notifyTriggerExistsQ.queryRow(ctx, s.db, nil).Scan(&exists)
	if err != nil {
		return fmt.Errorf("store: read notify trigger: %w", err)
	}
	if exists == on {
		return nil
	}
	ddl := notifyTriggerDropQ
	if on {
		ddl = notifyTriggerCreateQ
	}
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		// Never queue behind a long transaction while blocking producers.
		if _, err := tx.Exec(ctx, ddlLockTimeoutQ.sql); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, ddl.sql)
		return err
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" { // insufficient_privilege
		return fmt.Errorf("store: set notify trigger (poller.notify=%t): only the owner of outbox (the migration role, "+
			"docs/operations.md \"Roles and grants\") may create or drop its trigger; until it does, the poller polls every poller.poll_interval: %w", on, err)
	}
	if err != nil {
		return fmt.Errorf("store: set notify trigger (poller.notify=%t): %w", on, err)
	}
	return nil
}

// Stats is the outbox's backlog as operators see it.
type Stats struct {
	Pending          int64   `json:"pending"`
	OldestPendingAge float64 `json:"oldest_pending_age_seconds"`
	Dead             int64   `json:"dead"`
}

// The statements of session.sql and stats.sql that Store runs.
var (
	notifyTriggerExistsQ = stmt("notify_trigger_exists")
	notifyTriggerCreateQ = stmt("notify_trigger_create")
	notifyTriggerDropQ   = stmt("notify_trigger_drop")
	ddlLockTimeoutQ      = stmt("ddl_lock_timeout")
	statsQ               = stmt("stats")
)

// statsSettings: stats (stats.sql) is planned (and runs) with sorts off,
// so that its walk above the cursor is outbox_pending_idx, the one index
// that gives ids in order from the cursor (see stats.sql).
var statsSettings = []string{`SET LOCAL enable_sort = off`}

// Stats counts pending and dead rows and the oldest pending row's age.
func (s Ops) Stats(ctx context.Context) (Stats, error) { return s.stats(ctx) }

// Stats is Ops.Stats: the backlog the reconciler reports after a sweep.
func (s Reconcile) Stats(ctx context.Context) (Stats, error) { return s.stats(ctx) }

func (s *core) stats(ctx context.Context) (Stats, error) {
	var st Stats
	floor, err := s.sweepFloor(ctx)
	if err != nil {
		return st, err
	}
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		for _, set := range statsSettings {
			if _, err := tx.Exec(ctx, set); err != nil {
				return err
			}
		}
		return statsQ.queryRow(ctx, tx, pgx.NamedArgs{"floor": floor}).Scan(&st.Pending, &st.OldestPendingAge, &st.Dead)
	})
	if err != nil {
		return st, wrap("stats", err)
	}
	return st, nil
}
