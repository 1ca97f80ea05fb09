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
func (s *Store) BeginRun(ctx context.Context, f Fence, fireTime time.Time) (bool, error) {
	var n int64
	err := s.fenced(ctx, f, fenceCTE+`,
run AS (
  INSERT INTO reconcile_runs (fire_time, token)
  SELECT $4, $2 WHERE EXISTS (SELECT 1 FROM fence)
  ON CONFLICT (fire_time) DO NOTHING
  RETURNING 1)
SELECT EXISTS (SELECT 1 FROM fence), (SELECT count(*) FROM run)`, []*int64{&n}, fireTime)
	return n == 1, err
}

// FinishRun stores a run's summary, fenced. The summary goes as JSON text
// cast in the statement ($5::jsonb): the same in every query exec mode a
// postgres.dsn can choose (bytes go as bytea in the exec and
// simple_protocol modes, which jsonb refuses: every run would fail).
func (s *Store) FinishRun(ctx context.Context, f Fence, fireTime time.Time, summary any) error {
	b, err := json.Marshal(summary)
	if err != nil {
		return fmt.Errorf("store: encode summary: %w", err)
	}
	var n int64
	return s.fenced(ctx, f, fenceCTE+`,
run AS (
  UPDATE reconcile_runs SET finished_at = now(), summary = $5::jsonb
  WHERE fire_time = $4 AND EXISTS (SELECT 1 FROM fence)
  RETURNING 1)
SELECT EXISTS (SELECT 1 FROM fence), (SELECT count(*) FROM run)`, []*int64{&n}, fireTime, string(b))
}

// RunDone reports whether fireTime was already reconciled (started).
func (s *Store) RunDone(ctx context.Context, fireTime time.Time) (bool, error) {
	var ok bool
	err := s.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM reconcile_runs WHERE fire_time = $1)`, fireTime).Scan(&ok)
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

// PendingRows returns up to limit undelivered, not dead rows above cursor,
// in id order, as Stats counts them: every such row above the lowest cursor
// a poller saved (SaveCursor; with none saved, Store.SweepFloor's floor), and
// those backing off at or below it (by
// SaveCursor's rule, nothing else pending is there). It never walks the
// delivered history below that cursor: behind rows delivered while a
// snapshot is held (whose index entries vacuum cannot remove) a walk from
// id 0 reads a buffer per delivered row, each sweep, and competes with the
// relay for the server (docs/design.md, "The read path"). A row left out
// (re-pended below the cursor by an operator) costs no repair: the poller
// finds its delivered mark when it claims it, and marks it.
func (s *Store) PendingRows(ctx context.Context, cursor int64, limit int) ([]Pending, error) {
	floor, err := s.SweepFloor(ctx)
	if err != nil {
		return nil, err
	}
	return s.PendingRowsFrom(ctx, floor, cursor, limit)
}

// PendingRowsFrom is PendingRows with the floor SweepFloor returned, so
// that a sweep over many batches takes it once: without a saved cursor
// it is a scan of a pending index (see SweepFloor), and once per batch a
// sweep over a 1M backlog would make a thousand of them.
func (s *Store) PendingRowsFrom(ctx context.Context, floor *int64, cursor int64, limit int) ([]Pending, error) {
	rows, err := s.db.Query(ctx, pendingRowsSQL, cursor, limit, floor)
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
// computed here in Postgres (contentDigestSQL), so the repair sweep, which
// needs it only for the rows whose key holds a delivered mark, loads no
// payload, however large.
func (s *Store) ContentDigests(ctx context.Context, ids []int64) (map[int64][8]byte, error) {
	rows, err := s.db.Query(ctx, `SELECT id, `+contentDigestSQL+` FROM outbox WHERE id = ANY ($1::bigint[])`, ids)
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

// contentDigestSQL is keys.ContentOf in SQL: the first 8 bytes of
// SHA-256(SHA-256(payload) || SHA-256(headers)), each over the jsonb's text
// in UTF-8, which is what a read returns for the column (jsonb's binary
// form is a version byte and that same text), a NULL as empty.
const contentDigestSQL = `substr(sha256(sha256(convert_to(COALESCE(payload::text, ''), 'UTF8'))
  || sha256(convert_to(COALESCE(headers::text, ''), 'UTF8'))), 1, 8)`

// sweepFloorCTE is lowcur(lo): the poller's saved cursor in this epoch
// (savedCursorSQL), below which every row is delivered, dead or backing
// off (SaveCursor); with none saved, $N, the floor Store.SweepFloor
// computed.
func sweepFloorCTE(n string) string {
	return `lowcur AS MATERIALIZED (
  SELECT COALESCE(` + savedCursorSQL + `, ` + n + `::bigint) AS lo)`
}

// savedCursorSQL is the cursor of the outbox_cursor row of this epoch
// written last (NULL with none): the poller lock's in use. Every row holds
// a cursor valid when saved, but the lowest of them may be a row no
// poller writes any more: one left by a poller lock name changed in the
// config (poller.lock_name, redis.key_prefix) would keep the backlog count
// and the sweep walking from its old cursor for ever, more of the history
// each day, until an operator deleted it. A term under a new lock
// name has no row of its own, computes its cursor and saves it at its
// first read, so its row is the last written from then on; the retired
// name's row is never written again. Two relays under different lock
// names on one outbox at once (a misconfiguration that sends every row
// twice) make the floor the one that saved last.
const savedCursorSQL = `(SELECT cursor FROM outbox_cursor WHERE epoch = ` + epochSQL + ` ORDER BY updated_at DESC, cursor LIMIT 1)`

// pendingRowsSQL is PendingRows': the primary key from above both cursors
// in id order (never the history below the saved one), and the rows backing
// off below it through their own index (outbox_backoff_idx, the only
// index for a condition alone behind OFFSET 0; with the id range beside it
// the planner walks the primary key over the whole history instead).
// Above the cursors the pending condition is written in an opaque form
// (COALESCE) that no partial index's predicate follows from: written
// plainly, a plan made after ANALYZE saw few pending rows can walk
// outbox_pending_aggregate_idx whole (its entries for the history a held
// snapshot keeps included) and sort.
var pendingRowsSQL = `WITH ` + sweepFloorCTE("$3") + `
SELECT id, created_at, aggregate_type, aggregate_id, event_type FROM (
  (SELECT id, created_at, aggregate_type, aggregate_id, event_type FROM outbox
   WHERE COALESCE(dispatched_at IS NULL AND dead_at IS NULL, false) AND id > GREATEST($1::bigint, (SELECT lo FROM lowcur))
   ORDER BY id LIMIT $2::int)
  UNION ALL
  (SELECT * FROM (SELECT id, created_at, aggregate_type, aggregate_id, event_type FROM outbox
     WHERE ` + backingOff + ` OFFSET 0) b
   WHERE id > $1::bigint AND id <= (SELECT lo FROM lowcur))) p
ORDER BY id LIMIT $2::int`

// pendingByAttemptsSQL: the rows above the cursor through the primary key
// (the pending condition behind OFFSET 0: with it beside the range, a plan
// made on a small table walked outbox_pending_aggregate_idx whole, its
// history's entries included), and those backing off below it as in
// pendingRowsSQL.
var pendingByAttemptsSQL = `WITH ` + sweepFloorCTE("$1") + `
SELECT attempts, count(*) FROM (
  SELECT attempts FROM (SELECT attempts, dispatched_at IS NULL AND dead_at IS NULL AS pending FROM outbox
    WHERE id > (SELECT lo FROM lowcur) OFFSET 0) a
  WHERE pending
  UNION ALL
  SELECT attempts FROM (SELECT id, attempts FROM outbox WHERE ` + backingOff + ` OFFSET 0) b
  WHERE id <= (SELECT lo FROM lowcur)) p
GROUP BY attempts`

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

// Purge deletes one batch (up to limit rows after cursor, oldest first) of
// delivered or dead rows older than age, fenced. It returns how many it
// deleted and the cursor of the next batch. Pending rows are never touched.
// Age is measured on Postgres's clock (now() - age), the clock that wrote
// dispatched_at and dead_at, never the relay's.
//
// It walks the rows older than cutoff through the index on their time
// (outbox_dispatched_idx, outbox_dead_list_idx), never the table: a walk
// by id reads every row of the table on each sweep even when nothing is
// old enough, and with a snapshot held that grows with each row delivered.
func (s *Store) Purge(ctx context.Context, f Fence, kind PurgeKind, age time.Duration, cursor PurgeCursor, limit int) (n int64, next PurgeCursor, err error) {
	from := cursor.at
	if !from.Valid {
		from = pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	}
	next = cursor
	err = s.fencedScan(ctx, f, purgeSQL(kind), []any{&n, &next.at, &next.id}, max(age, 0).Microseconds(), from, cursor.id, limit)
	return n, next, err
}

// purgeSQL is Purge's statement for kind. Rows are taken in (time, id)
// order; the cursor's own time is walked again only for the ids after it
// (one batch's marks share a time). The age condition is in the DELETE's
// own WHERE too: a row updated after the statement's snapshot (an
// operator making it pending again) is re-checked by Postgres against
// those conditions only, not against the subquery that chose its id, and
// was deleted (TestPurgeKeepsARowMadePendingWhileItRuns). The rows' attempt
// history (outbox_attempts) goes in the same statement.
func purgeSQL(kind PurgeKind) string {
	col := "dispatched_at"
	if kind == PurgeDead {
		col = "dead_at"
	}
	return fenceCTE + `,
del AS (
  DELETE FROM outbox WHERE id = ANY (ARRAY(
    SELECT id FROM outbox WHERE ` + col + ` < now() - $4::bigint * interval '1 microsecond' AND ` + col + ` >= $5 AND (` + col + ` > $5 OR id > $6)
    ORDER BY ` + col + `, id LIMIT $7))
  AND ` + col + ` < now() - $4::bigint * interval '1 microsecond' AND EXISTS (SELECT 1 FROM fence)
  RETURNING id, ` + col + ` AS at),
history AS (DELETE FROM outbox_attempts a WHERE a.outbox_id IN (SELECT id FROM del)),
lastrow AS (SELECT at, id FROM del ORDER BY at DESC, id DESC LIMIT 1)
SELECT EXISTS (SELECT 1 FROM fence), (SELECT count(*) FROM del),
  COALESCE((SELECT at FROM lastrow), $5), COALESCE((SELECT id FROM lastrow), $6)`
}

// PendingByAttempts counts undelivered rows per attempts value, the rows
// Stats counts (see PendingRows): a count over the whole pending index
// walked every entry vacuum had not removed, the delivered history of a
// held snapshot included.
func (s *Store) PendingByAttempts(ctx context.Context) (map[int]int64, error) {
	floor, err := s.SweepFloor(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := s.db.Query(ctx, pendingByAttemptsSQL, floor)
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
// when a cursor is saved; without one, pendingFloor's bitmap scan, at each
// call until the poller's first save (a second or so after its first
// read): counted from id 0, the repair sweep's first batch and the backlog
// count would walk the history a held snapshot keeps, a buffer per row.
func (s *Store) SweepFloor(ctx context.Context) (*int64, error) {
	var saved bool
	if err := s.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM outbox_cursor WHERE epoch = `+epochSQL+`)`).Scan(&saved); err != nil {
		return nil, wrap("cursor floor", err)
	}
	if saved {
		return nil, nil
	}
	f, err := s.pendingFloor(ctx, pendingFloorSQL)
	if err != nil {
		return nil, err
	}
	if !f.Valid {
		f.Int64 = math.MaxInt64 // nothing pending but rows backing off
	}
	return &f.Int64, nil
}

// pendingFloorSQL: the id before the lowest pending row not backing off
// (NULL: none). loadFloorSQL: the id before the lowest pending row.
const (
	pendingFloorSQL = `SELECT min(id) - 1 FROM outbox
  WHERE dispatched_at IS NULL AND dead_at IS NULL AND available_at <= created_at`
	loadFloorSQL = `SELECT min(id) - 1 FROM outbox WHERE dispatched_at IS NULL AND dead_at IS NULL`
)

// floorSettings: pendingFloor's plans walk no index in order.
var floorSettings = []string{`SET LOCAL enable_indexscan = off`, `SET LOCAL enable_indexonlyscan = off`}

// pendingFloor runs sql (pendingFloorSQL, loadFloorSQL) with ordered index
// walks off, so its plan is a bitmap scan of a pending index: each of its
// pages and each heap page its entries point to read once. That still
// grows with the history a snapshot held elsewhere keeps in the index (a
// few buffers per 1,000 rows; no bound is possible without a saved
// cursor), but never more: walked in order, the entries' heap rows are
// each a buffer, and the planner chooses that walk
// (outbox_pending_aggregate_idx, then a sort) for min(id) or ORDER BY id
// LIMIT 1 whenever its estimates see few pending rows, on a small table or
// after ANALYZE.
func (s *Store) pendingFloor(ctx context.Context, sql string) (pgtype.Int8, error) {
	var f pgtype.Int8
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		for _, set := range floorSettings {
			if _, err := tx.Exec(ctx, set); err != nil {
				return err
			}
		}
		return tx.QueryRow(ctx, sql).Scan(&f)
	})
	if err != nil {
		return f, wrap("pending floor", err)
	}
	return f, nil
}
