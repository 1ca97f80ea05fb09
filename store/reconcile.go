package store

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// BeginRun records that fireTime is being reconciled, fenced. It reports
// false when that fire time already ran (on any replica).
func (s Reconcile) BeginRun(ctx context.Context, f Fence, fireTime time.Time) (bool, error) {
	var n int64
	err := s.fenced(ctx, f, beginRunQ, []*int64{&n}, pgx.NamedArgs{"fire_time": fireTime})
	return n == 1, err
}

// Run is a finished run: its fire time and its summary (any value JSON
// encodes).
type Run struct {
	FireTime time.Time
	Summary  any
}

// FinishRun stores a run's summary, fenced. The summary goes as JSON text
// cast in the statement (reconcile.sql): the same in every query exec mode a
// postgres.dsn can choose (bytes go as bytea in the exec and
// simple_protocol modes, which jsonb refuses: every run would fail).
func (s Reconcile) FinishRun(ctx context.Context, f Fence, r Run) error {
	fireTime := r.FireTime
	b, err := json.Marshal(r.Summary)
	if err != nil {
		return fmt.Errorf("store: encode summary: %w", err)
	}
	var n int64
	return s.fenced(ctx, f, finishRunQ, []*int64{&n}, pgx.NamedArgs{"fire_time": fireTime, "summary": string(b)})
}

// RunDone reports whether fireTime was already reconciled (started).
func (s Reconcile) RunDone(ctx context.Context, fireTime time.Time) (bool, error) {
	var ok bool
	err := runDoneQ.queryRow(ctx, s.db, pgx.NamedArgs{"fire_time": fireTime}).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("store: read reconcile runs: %w", err)
	}
	return ok, nil
}

// Pending is an undelivered row as the repair sweep needs it: what its
// idempotency key's delivered mark is computed from (keys.Fingerprint),
// but the payload and headers, whose digest ContentDigests computes for
// the few rows that need it.
type Pending struct {
	ID            int64
	CreatedAt     time.Time
	Finite        bool // created_at is a finite time (an infinite one has no mark)
	AggregateType string
	AggregateID   string
	EventType     string
}

// PendingPage asks PendingRowsFrom for one batch.
type PendingPage struct {
	// Floor is what SweepFloor returned, taken once per sweep.
	Floor *int64
	// After is the id the batch starts above.
	After int64
	// Limit is the most rows the batch holds.
	Limit int
}

// PendingRowsFrom returns up to p.Limit undelivered, not dead rows above
// p.After, in id order, as Stats counts them: every such row above the lowest cursor
// a poller saved (SaveCursor; with none saved, Reconcile.SweepFloor's floor), and
// those backing off at or below it (by
// SaveCursor's rule, nothing else pending is there). It never walks the
// delivered history below that cursor: behind rows delivered while a
// snapshot is held (whose index entries vacuum cannot remove) a walk from
// id 0 reads a buffer per delivered row, each sweep, and competes with the
// relay for the server (docs/design.md, "The read path"). A row left out
// (re-pended below the cursor by an operator) costs no repair: the poller
// finds its delivered mark when it claims it, and marks it.
//
// p.Floor is what SweepFloor returned, taken once per sweep: without a
// saved cursor it is a scan of a pending index (see SweepFloor), and once
// per batch a sweep over a 1M backlog would make a thousand of them.
func (s Reconcile) PendingRowsFrom(ctx context.Context, p PendingPage) ([]Pending, error) {
	floor, cursor, limit := p.Floor, p.After, p.Limit
	rows, err := pendingRowsQ.query(ctx, s.db, pgx.NamedArgs{"cursor": cursor, "limit": limit, "floor": floor})
	if err != nil {
		return nil, fmt.Errorf("store: pending rows: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Pending, error) {
		var p Pending
		var at pgtype.Timestamptz
		err := r.Scan(&p.ID, &at, &p.AggregateType, &p.AggregateID, &p.EventType)
		p.CreatedAt, p.Finite = at.Time, at.Valid && at.InfinityModifier == pgtype.Finite
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: pending rows: %w", err)
	}
	return out, nil
}

// ContentDigests returns, for each of ids still in the table, the digest
// of its payload and headers that keys.ContentOf computes from the bytes a
// read of those columns returns (the relay's read loads them to send):
// computed here in Postgres (content_digests in reconcile.sql), so the repair sweep, which
// needs it only for the rows whose key holds a delivered mark, loads no
// payload, however large.
func (s Reconcile) ContentDigests(ctx context.Context, ids []int64) (map[int64][8]byte, error) {
	rows, err := contentDigestsQ.query(ctx, s.db, pgx.NamedArgs{"ids": ids})
	if err != nil {
		return nil, fmt.Errorf("store: content digests: %w", err)
	}
	out := make(map[int64][8]byte, len(ids))
	var id int64
	var d []byte
	if _, err := pgx.ForEachRow(rows, []any{&id, &d}, func() error {
		if len(d) != 8 {
			return fmt.Errorf("row %d: a digest of %d bytes", id, len(d))
		}
		out[id] = [8]byte(d)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("store: content digests: %w", err)
	}
	return out, nil
}

// The statements of reconcile.sql and stats.sql.
var (
	beginRunQ          = stmt("begin_run")
	finishRunQ         = stmt("finish_run")
	runDoneQ           = stmt("run_done")
	pendingRowsQ       = stmt("pending_rows")
	contentDigestsQ    = stmt("content_digests")
	pendingByAttemptsQ = stmt("pending_by_attempts")
	purgeDeliveredQ    = stmt("purge_delivered")
	purgeDeadQ         = stmt("purge_dead")
	cursorSavedQ       = stmt("cursor_saved")
	pendingFloorQ      = stmt("pending_floor")
	loadFloorQ         = stmt("load_floor")
)

// PurgeKind selects what Purge deletes.
type PurgeKind int

const (
	PurgeDelivered PurgeKind = iota // dispatched_at before the cutoff
	PurgeDead                       // dead_at before the cutoff
)

// PurgeCursor is where a purge sweep stands: the last row it deleted, in
// the order it deletes them (oldest first). The zero value starts a sweep.
type PurgeCursor struct {
	at pgtype.Timestamptz
	id int64
}

// PurgeBatch asks Purge for one batch: up to Limit rows of Kind older
// than Age, after the cursor After (the zero value: from the oldest).
type PurgeBatch struct {
	Kind  PurgeKind
	Age   time.Duration
	After PurgeCursor
	Limit int
}

// Purged is what one Purge deleted: how many rows, and the cursor of the
// next batch.
type Purged struct {
	Rows int64
	Next PurgeCursor
}

// Purge deletes one batch (up to b.Limit rows after b.After, oldest first)
// of delivered or dead rows older than b.Age, fenced. It returns how many
// it deleted and the cursor of the next batch. Pending rows are never touched.
// Age is measured on Postgres's clock (now() - age), the clock that wrote
// dispatched_at and dead_at, never the relay's.
//
// It walks the rows older than cutoff through the index on their time
// (outbox_dispatched_idx, outbox_dead_list_idx), never the table: a walk
// by id reads every row of the table on each sweep even when nothing is
// old enough, and with a snapshot held that grows with each row delivered.
func (s Reconcile) Purge(ctx context.Context, f Fence, b PurgeBatch) (Purged, error) {
	kind, age, cursor, limit := b.Kind, b.Age, b.After, b.Limit
	var n int64
	from := cursor.at
	if !from.Valid {
		from = pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	}
	next := cursor
	err := s.fencedScan(ctx, f, purgeQuery(kind), []any{&n, &next.at, &next.id}, pgx.NamedArgs{
		"age_us": max(age, 0).Microseconds(), "after_at": from, "after_id": cursor.id, "limit": limit,
	})
	return Purged{Rows: n, Next: next}, err
}

// purgeQuery is Purge's statement for kind (reconcile.sql).
func purgeQuery(kind PurgeKind) query {
	if kind == PurgeDead {
		return purgeDeadQ
	}
	return purgeDeliveredQ
}

// PendingByAttempts counts undelivered rows per attempts value, the rows
// Stats counts (see PendingRows): a count over the whole pending index
// walked every entry vacuum had not removed, the delivered history of a
// held snapshot included.
func (s Reconcile) PendingByAttempts(ctx context.Context) (map[int]int64, error) {
	floor, err := s.sweepFloor(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := pendingByAttemptsQ.query(ctx, s.db, pgx.NamedArgs{"floor": floor})
	if err != nil {
		return nil, fmt.Errorf("store: attempts histogram: %w", err)
	}
	out := map[int]int64{}
	var a int
	var c int64
	if _, err := pgx.ForEachRow(rows, []any{&a, &c}, func() error { out[a] = c; return nil }); err != nil {
		return nil, fmt.Errorf("store: attempts histogram: %w", err)
	}
	return out, nil
}

// SweepFloor is the floor the backlog count and the sweep start from when no
// poller saved a cursor in this epoch yet (a first start, the first start
// after an upgrade or a TRUNCATE, until the poller's first save): just
// below the lowest pending row not backing off (those are counted through
// outbox_backoff_idx), or above every id when there is none. Nil when a
// cursor is saved: the statements read it themselves. One cheap look-up
// when a cursor is saved; without one, pendingFloor's walk, at each
// call until the poller's first save (a second or so after its first
// read): counted from id 0, the repair sweep's first batch and the backlog
// count would walk the history a held snapshot keeps, a buffer per row.
func (s Reconcile) SweepFloor(ctx context.Context) (*int64, error) { return s.sweepFloor(ctx) }

func (s *core) sweepFloor(ctx context.Context) (*int64, error) {
	var saved bool
	if err := cursorSavedQ.queryRow(ctx, s.db, nil).Scan(&saved); err != nil {
		return nil, wrap("cursor floor", err)
	}
	if saved {
		return nil, nil
	}
	f, err := s.pendingFloor(ctx, pendingFloorQ)
	if err != nil {
		return nil, err
	}
	if !f.Valid {
		f.Int64 = math.MaxInt64 // nothing pending but rows backing off
	}
	return &f.Int64, nil
}

// floorSettings: pendingFloor's plans take the id order from
// outbox_pending_idx, never from a sort.
var floorSettings = []string{`SET LOCAL enable_sort = off`}

// pendingFloor runs q (pending_floor, load_floor in stats.sql) as a walk of
// outbox_pending_idx in id order that stops at the first row it may see.
// Without history that is a few buffers. Behind history a snapshot held
// elsewhere keeps in the index, the walk passes those entries first, their
// heap pages in id order, each read once (a few buffers per 1,000 rows; no
// bound is possible without a saved cursor), but never more. Sorts are off
// because every other plan sorts: outbox_pending_aggregate_idx, which the
// planner picks whenever its estimates see few pending rows (a small
// table, or after ANALYZE), reads the history in aggregate order, a buffer
// per row (TestFirstStartCostsNoMoreThanOneWalkOfThePendingIndex), and a
// bitmap reads the heap page of every pending row before it answers
// (TestFloorStopsAtTheBacklogsFirstRow).
func (s *core) pendingFloor(ctx context.Context, q query) (pgtype.Int8, error) {
	var f pgtype.Int8
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		for _, set := range floorSettings {
			if _, err := tx.Exec(ctx, set); err != nil {
				return err
			}
		}
		return q.queryRow(ctx, tx, nil).Scan(&f)
	})
	if err != nil {
		return f, wrap("pending floor", err)
	}
	return f, nil
}
