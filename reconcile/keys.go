package reconcile

import (
	"context"
	"time"

	"github.com/outboxd/outboxd/store"
)

// The idempotency keys in Postgres (idempotency.store: postgres; Deps.Redis
// nil): the repair sweep reads the marks from outboxd's own table, and
// retention deletes the keys that expired there (Redis expires its own).

// pgMarks reads the live keys of rows from Postgres: the values in rows
// order ("" for none) and, for each, -1 (a key in Postgres is never a bare
// "1" of an earlier version: those were written to Redis alone).
func (r *Reconciler) pgMarks(ctx context.Context, rows []store.Pending) ([]string, []time.Duration, error) {
	ids := make([]int64, len(rows))
	for i, row := range rows {
		ids[i] = row.ID
	}
	qctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	found, err := r.store.KeyValues(qctx, ids)
	if err != nil {
		return nil, nil, err
	}
	vals, pttls := make([]string, len(rows)), make([]time.Duration, len(rows))
	for i, id := range ids {
		vals[i], pttls[i] = found[id], -1
	}
	return vals, pttls, nil
}

// purgeKeys deletes the expired idempotency keys in Postgres, in batches,
// fenced; with the keys in Redis it does nothing.
func (r *Reconciler) purgeKeys(ctx context.Context, fence store.Fence) (int64, error) {
	if r.rdb != nil {
		return 0, nil
	}
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return total, context.Cause(ctx)
		}
		wctx, cancel := writeCtx(ctx)
		n, err := r.store.PurgeKeys(wctx, fence, r.cfg.BatchSize)
		cancel()
		if err != nil {
			return total, err
		}
		total += n
		r.m.ReconcileSwept.WithLabelValues("purged_idempotency_keys").Add(float64(n))
		if n < int64(r.cfg.BatchSize) {
			return total, nil
		}
	}
}
