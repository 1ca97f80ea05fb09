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
	"github.com/jackc/pgx/v5/pgtype"
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

// Store wraps a pgx pool.
type Store struct {
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
// force_generic_plan, unless the config sets it): the relay's read (readSQL)
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
	st := &Store{pool: pool, db: pool, want: want, schema: o.Schema}
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

// rowSizeSQL measures a row without sending it: pg_column_size reads the
// stored size from the datum header. A compressed jsonb (its stored size can
// be a hundredth of its real size) is measured decompressed: '[]' || x is an
// uncompressed copy of x (x itself for an array, [x] otherwise), whatever x
// holds. On large compressed rows that is far cheaper than their text size
// (jsonb_out) or jsonb_path_query_first.
const rowSizeSQL = `(CASE WHEN pg_column_compression(o.payload) IS NULL THEN pg_column_size(o.payload)
       ELSE pg_column_size('[]'::jsonb || o.payload) END
  + CASE WHEN pg_column_compression(o.headers) IS NULL THEN pg_column_size(o.headers)
       ELSE pg_column_size('[]'::jsonb || o.headers) END
  + octet_length(o.aggregate_type) + octet_length(o.aggregate_id) + octet_length(o.event_type))::bigint`

// fetchDueSQL: due rows in id order, skipping every row of an aggregate that
// has an earlier undelivered row still backing off, so per-aggregate order is
// never broken. Dead rows do not block their aggregate (see README). A
// delayed row is one whose available_at is past its created_at; producers
// must not set created_at into the future.
//
// Rows in $4 are left out (see FetchLimits.Skip), and every row of the
// aggregates in $5, $6 (types, ids; see FetchLimits.Busy). Both as NOT IN
// (the columns are NOT NULL): a hashed subplan filtering the id-ordered
// scan. An anti-join there lets the planner trade that scan for a full one
// and a sort once the busy list is long, several times slower.
//
// It walks outbox_pending_idx from its start: the poller reads with Read,
// which starts at a cursor; FetchDue is the stateless form (tools, tests).
//
// Of those candidates ($1 at most) it returns the prefix whose loaded bytes
// stay within $3 (always the first row): a prefix, so no aggregate gets a
// gap. A row above $2 bytes is returned without payload and headers (and
// with its text columns cut), so it is never loaded whole; it costs 0 bytes.
// One window (a running sum over the LIMIT's output) keeps the cost of the
// budget small beside the scan.
const fetchDueSQL = `
SELECT id,
  CASE WHEN size <= $2 THEN aggregate_type ELSE left(aggregate_type, 200) END,
  CASE WHEN size <= $2 THEN aggregate_id ELSE left(aggregate_id, 200) END,
  CASE WHEN size <= $2 THEN event_type ELSE left(event_type, 200) END,
  CASE WHEN size <= $2 THEN payload END, CASE WHEN size <= $2 THEN headers END,
  created_at, attempts, size
FROM (
  SELECT d.*, sum(CASE WHEN d.size <= $2 THEN d.size::int4 ELSE 0 END) OVER w AS loaded, row_number() OVER w AS n
  FROM (
    SELECT o.id, o.aggregate_type, o.aggregate_id, o.event_type, o.payload, o.headers, o.created_at, o.attempts,
      ` + rowSizeSQL + ` AS size
    FROM outbox o
    WHERE o.dispatched_at IS NULL AND o.dead_at IS NULL AND o.available_at <= now()
      AND o.id NOT IN (SELECT unnest($4::bigint[])) -- a hashed subplan
      AND (o.aggregate_type, o.aggregate_id) NOT IN (SELECT b.t, b.a FROM unnest($5::text[], $6::text[]) b(t, a))
      AND NOT EXISTS (
        SELECT 1 FROM outbox e
        WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id
          AND e.id < o.id AND ` + backingOffE + ` AND e.available_at > now())
    ORDER BY o.id
    LIMIT $1) d
  WINDOW w AS (ORDER BY d.id ROWS UNBOUNDED PRECEDING)
) x
WHERE n = 1 OR loaded <= $3
ORDER BY id`

// maxRowBytes is the largest per-row limit FetchDue accepts: a loaded row's
// size is summed as int4.
const maxRowBytes = math.MaxInt32

// FetchDue reads due rows in id order within lim.
func (s *Store) FetchDue(ctx context.Context, lim FetchLimits) ([]Row, error) {
	rowBytes, budget := lim.RowBytes, lim.Bytes
	if rowBytes <= 0 || rowBytes > maxRowBytes {
		rowBytes = maxRowBytes
	}
	if budget <= 0 {
		budget = math.MaxInt64
	}
	bt, ba := make([]string, len(lim.Busy)), make([]string, len(lim.Busy))
	for i, b := range lim.Busy {
		bt[i], ba[i] = b.Type, b.ID
	}
	res, err := s.db.Query(ctx, fetchDueSQL, lim.Rows, rowBytes, budget, lim.Skip, bt, ba)
	if err != nil {
		return nil, wrap("fetch due", err)
	}
	rows, err := pgx.CollectRows(res, func(r pgx.CollectableRow) (Row, error) {
		var x Row
		var created pgtype.Timestamptz
		// Payload and headers as raw bytes: scanning into json.RawMessage
		// would run json.Unmarshal over every payload on the hot path, and
		// Postgres already validated the jsonb.
		err := r.Scan(&x.ID, &x.AggregateType, &x.AggregateID, &x.EventType, (*[]byte)(&x.Payload), (*[]byte)(&x.Headers),
			&created, &x.Attempts, &x.Size)
		switch {
		case err != nil:
		case x.Size > rowBytes:
			x.Poison = fmt.Sprintf("row is %d bytes, above poller.max_payload_bytes (%d): not loaded, not sent", x.Size, rowBytes)
		case created.InfinityModifier != pgtype.Finite:
			x.Poison = "created_at is infinite: the event cannot be timestamped"
		}
		x.CreatedAt = created.Time
		return x, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: fetch due: %w", err)
	}
	return rows, nil
}

// Listen holds one connection in LISTEN channel and calls fn for each
// notification until ctx is done or the connection fails.
func (s *Store) Listen(ctx context.Context, channel string, fn func()) error {
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
	err := s.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_trigger
		WHERE tgname = 'outbox_notify' AND tgrelid = 'outbox'::regclass)`).Scan(&exists)
	if err != nil {
		return fmt.Errorf("store: read notify trigger: %w", err)
	}
	if exists == on {
		return nil
	}
	sql := `DROP TRIGGER IF EXISTS outbox_notify ON outbox`
	if on {
		sql = `CREATE OR REPLACE TRIGGER outbox_notify AFTER INSERT ON outbox
		       FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify()`
	}
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		// Never queue behind a long transaction while blocking producers.
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '5s'`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, sql)
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

// statsSQL counts from the poller's saved cursor (outbox_cursor, this
// epoch, the row written last: savedCursorSQL) on: at or below it every
// row is delivered, dead or backing off.
// With none saved yet, from $1, Store.SweepFloor's floor, which has the same
// property.
// From id 0 each scrape would walk the entry of every row delivered while
// a snapshot is held elsewhere (vacuum cannot remove them), growing
// without bound. Rows
// an operator makes pending again below the cursor count once the
// poller's rescan has found them (poller.rescanEvery) and saved a cursor
// below them.
//
// Above the cursor it is one walk of outbox_pending_idx from the cursor
// on, reading the index alone: its entries of pending rows, and of rows
// delivered since the save (at most saveEvery's worth), whose heap row is
// looked at once, the entry then marked dead for later scrapes (under a
// snapshot held elsewhere, looked at by each scrape). A walk of the
// primary key instead, the pending conditions as FILTERs, would read every
// row above the cursor in the heap, old and new versions, which a drain
// scatters. The walk is asked for in id order (ORDER BY id in a subquery,
// which keeps it) and planned with sorts off (statsSettings):
// outbox_pending_aggregate_idx has the same predicate and holds id too,
// and a plan made when ANALYZE saw nothing pending reads it whole (every
// entry a held snapshot keeps) and sorts, priced below the walk from the
// cursor by its leading column's correlation; without a sort, only
// outbox_pending_idx gives the order (TestHotPathCostDoesNotGrowWithHistory,
// TestBacklogCountReadsThePendingIndexAlone). Below the cursor, the rows
// backing off through outbox_backoff_idx, alone behind OFFSET 0 (with the
// id range beside it the planner walks the primary key instead); the lowest of them
// likewise, so that min(id) is not planned as a walk of an index from its
// start.
const statsSQL = `
WITH c AS MATERIALIZED (
  SELECT COALESCE(` + savedCursorSQL + `, $1::bigint) AS lo),
above AS MATERIALIZED (
  SELECT count(*) AS pending, min(id) AS first FROM (
    SELECT id FROM outbox WHERE dispatched_at IS NULL AND dead_at IS NULL AND id > (SELECT lo FROM c)
    ORDER BY id) p),
delayed AS MATERIALIZED (
  SELECT id FROM outbox WHERE ` + backingOff + ` OFFSET 0)
SELECT
  above.pending + (SELECT count(*) FROM delayed WHERE id <= (SELECT lo FROM c)),
  COALESCE((SELECT extract(epoch FROM now() - created_at)::float8 FROM outbox WHERE id = LEAST(
    (SELECT min(id) FROM delayed), above.first)), 0),
  (SELECT count(*) FROM outbox WHERE dead_at IS NOT NULL)
FROM above`

// statsSettings: statsSQL is planned (and runs) with sorts off, so that
// its walk above the cursor is outbox_pending_idx, the one index that
// gives ids in order from the cursor (see statsSQL).
var statsSettings = []string{`SET LOCAL enable_sort = off`}

// Stats counts pending and dead rows and the oldest pending row's age.
func (s *Store) Stats(ctx context.Context) (Stats, error) {
	var st Stats
	floor, err := s.SweepFloor(ctx)
	if err != nil {
		return st, err
	}
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		for _, set := range statsSettings {
			if _, err := tx.Exec(ctx, set); err != nil {
				return err
			}
		}
		return tx.QueryRow(ctx, statsSQL, floor).Scan(&st.Pending, &st.OldestPendingAge, &st.Dead)
	})
	if err != nil {
		return st, wrap("stats", err)
	}
	return st, nil
}
