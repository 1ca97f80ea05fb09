package store

import (
	"context"
	"encoding/json"
	"fmt"
)

// Discarded is a dead row DiscardDead removed, as the command prints it.
type Discarded struct {
	ID            int64  `json:"id"`
	AggregateType string `json:"aggregate_type"`
	AggregateID   string `json:"aggregate_id"`
	EventType     string `json:"event_type"`
}

// discardSQL deletes the next batch of f's dead rows (pickDeadSQL) as one
// fenced statement; the DELETE re-checks dead_at, so a row requeued
// meanwhile is not touched, and the deleted rows' attempt history goes
// with them. It returns the fence's outcome, how many rows
// it deleted, the last of them (dead_at, id) as the next cursor, and the
// deleted rows as a JSON array in (dead_at, id) order.
func discardSQL(f DeadFilter) (string, []any) {
	picked, args := pickDeadSQL(f)
	return fenceCTE + `,
` + picked + `,
removed AS (
  DELETE FROM outbox o USING picked
  WHERE o.id = picked.id AND o.dead_at IS NOT NULL AND EXISTS (SELECT 1 FROM fence)
  RETURNING o.id, o.aggregate_type, o.aggregate_id, o.event_type, picked.dead_at),
history AS (DELETE FROM outbox_attempts a WHERE a.outbox_id IN (SELECT id FROM removed)),
last AS (SELECT dead_at, id FROM removed ORDER BY dead_at DESC, id DESC LIMIT 1)
SELECT EXISTS (SELECT 1 FROM fence), (SELECT count(*) FROM removed),
  (SELECT dead_at FROM last), COALESCE((SELECT id FROM last), 0),
  COALESCE((SELECT json_agg(json_build_object('id', id, 'aggregate_type', aggregate_type,
    'aggregate_id', aggregate_id, 'event_type', event_type) ORDER BY dead_at, id) FROM removed), '[]')`, args
}

// DiscardDead deletes the dead rows f selects, in batches of batchSize,
// calling removed with each batch's rows. Pending and delivered rows are
// never touched. Like ReplayDead, each batch is one statement under fence
// (the holder of lock:reconciliation), so a discard whose term was taken
// over deletes nothing more: it returns how many rows it deleted before,
// and ErrStaleFence.
func (s *Store) DiscardDead(ctx context.Context, fence Fence, f DeadFilter, batchSize int, removed func([]Discarded)) (int64, error) {
	sql, args := discardSQL(f)
	var rows []byte
	var decodeErr error
	n, err := s.deadBatches(ctx, fence, "discard", sql, args, batchSize, []any{&rows}, func(n int64) {
		var batch []Discarded
		if err := json.Unmarshal(rows, &batch); err != nil {
			decodeErr = fmt.Errorf("store: discard: read the removed rows: %w", err)
			return
		}
		if removed != nil && len(batch) > 0 {
			removed(batch)
		}
	})
	if err == nil {
		err = decodeErr
	}
	return n, err
}
