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

// Discard says which dead rows DiscardDead deletes, and how.
type Discard struct {
	Filter    DeadFilter
	BatchSize int // rows per statement (<= 0: 1000)
	// Removed, if not nil, is called with each batch's rows.
	Removed func([]Discarded)
}

// DiscardDead deletes the dead rows p.Filter selects, in batches of
// p.BatchSize, calling p.Removed with each batch's rows. Pending and delivered rows are
// never touched. Like ReplayDead, each batch is one statement under fence
// (the holder of lock:reconciliation), so a discard whose term was taken
// over deletes nothing more: it returns how many rows it deleted before,
// and ErrStaleFence.
func (s Reconcile) DiscardDead(ctx context.Context, fence Fence, p Discard) (int64, error) {
	f, batchSize, removed := p.Filter, p.BatchSize, p.Removed
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
