package store

import (
	"context"
	"encoding/json"
	"fmt"
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

// FinishRun stores a run's summary, fenced.
func (s *Store) FinishRun(ctx context.Context, f Fence, fireTime time.Time, summary any) error {
	b, err := json.Marshal(summary)
	if err != nil {
		return fmt.Errorf("store: encode summary: %w", err)
	}
	var n int64
	return s.fenced(ctx, f, fenceCTE+`,
run AS (
  UPDATE reconcile_runs SET finished_at = now(), summary = $5
  WHERE fire_time = $4 AND EXISTS (SELECT 1 FROM fence)
  RETURNING 1)
SELECT EXISTS (SELECT 1 FROM fence), (SELECT count(*) FROM run)`, []*int64{&n}, fireTime, b)
}

// RunDone reports whether fireTime was already reconciled (started).
func (s *Store) RunDone(ctx context.Context, fireTime time.Time) (bool, error) {
	var ok bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM reconcile_runs WHERE fire_time = $1)`, fireTime).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("store: read reconcile runs: %w", err)
	}
	return ok, nil
}

// Pending is an undelivered row as the repair sweep needs it: what its
// idempotency key's delivered mark is computed from (keys.Fingerprint).
type Pending struct {
	ID            int64
	CreatedAt     time.Time
	Finite        bool // created_at is a finite time (an infinite one has no mark)
	AggregateType string
	AggregateID   string
	EventType     string
}

// PendingRows returns up to limit undelivered, not dead rows above cursor, in id order.
func (s *Store) PendingRows(ctx context.Context, cursor int64, limit int) ([]Pending, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, created_at, aggregate_type, aggregate_id, event_type FROM outbox
		WHERE dispatched_at IS NULL AND dead_at IS NULL AND id > $1 ORDER BY id LIMIT $2`, cursor, limit)
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

// PurgeKind selects what Purge deletes.
type PurgeKind int

const (
	PurgeDelivered PurgeKind = iota // dispatched_at before the cutoff
	PurgeDead                       // dead_at before the cutoff
)

// Purge deletes one batch (up to limit rows, ids above cursor) of delivered
// or dead rows older than cutoff, fenced. It returns how many it deleted and
// the highest id deleted (the next cursor). Pending rows are never touched.
func (s *Store) Purge(ctx context.Context, f Fence, kind PurgeKind, cutoff time.Time, cursor int64, limit int) (n, last int64, err error) {
	col := "dispatched_at"
	if kind == PurgeDead {
		col = "dead_at"
	}
	sql := fenceCTE + `,
del AS (
  DELETE FROM outbox WHERE id IN (
    SELECT id FROM outbox WHERE ` + col + ` < $4 AND id > $5 ORDER BY id LIMIT $6)
  AND EXISTS (SELECT 1 FROM fence)
  RETURNING id)
SELECT EXISTS (SELECT 1 FROM fence), (SELECT count(*) FROM del), (SELECT COALESCE(max(id), 0) FROM del)`
	err = s.fenced(ctx, f, sql, []*int64{&n, &last}, cutoff, cursor, limit)
	return n, last, err
}

// PendingByAttempts counts undelivered rows per attempts value.
func (s *Store) PendingByAttempts(ctx context.Context) (map[int]int64, error) {
	rows, err := s.pool.Query(ctx, `SELECT attempts, count(*) FROM outbox
		WHERE dispatched_at IS NULL AND dead_at IS NULL GROUP BY attempts`)
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
