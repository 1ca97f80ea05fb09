package store

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Discarded is a dead row DiscardDead removed, as the command prints it.
type Discarded struct {
	ID            int64  `json:"id"`
	AggregateType string `json:"aggregate_type"`
	AggregateID   string `json:"aggregate_id"`
	EventType     string `json:"event_type"`
}

// DiscardDead deletes the dead rows f selects, in batches of batchSize,
// calling removed with each batch's rows. Pending and delivered rows are
// never touched. Like ReplayDead, each batch is one statement under fence
// (the holder of lock:reconciliation), so a discard whose term was taken
// over deletes nothing more: it returns how many rows it deleted before,
// and ErrStaleFence.
func (s *Store) DiscardDead(ctx context.Context, fence Fence, f DeadFilter, batchSize int, removed func([]Discarded)) (int64, error) {
	na := pgx.NamedArgs{}
	q := deadDiscardQ.with(f.filter(na))
	var rows []byte
	var decodeErr error
	n, err := s.deadBatches(ctx, fence, "discard", q, na, batchSize, []any{&rows}, func(n int64) {
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
