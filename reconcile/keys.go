package reconcile

import (
	"context"
	"math"
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

// purgeKeyWindow is how many keys, in batches of reconcile.batch_size,
// one statement of purgeKeys scans: a window of that many live keys ends
// the walk.
const purgeKeyWindow = 4

// purgeKeys deletes the expired idempotency keys in Postgres, fenced, one
// window of keys at a time in outbox_id order from the lowest (see
// idempotency_purge): it stops at the end of the table or at the first
// window with no expired key. With the keys in Redis it does nothing.
func (r *Reconciler) purgeKeys(ctx context.Context, fence store.Fence) (int64, error) {
	if r.rdb != nil {
		return 0, nil
	}
	var total int64
	after := int64(math.MinInt64)
	for {
		if err := ctx.Err(); err != nil {
			return total, context.Cause(ctx)
		}
		wctx, cancel := writeCtx(ctx)
		p, err := r.store.PurgeKeys(wctx, fence, after, purgeKeyWindow*r.cfg.BatchSize)
		cancel()
		if err != nil {
			return total, err
		}
		total += p.Deleted
		r.m.ReconcileSwept.WithLabelValues("purged_idempotency_keys").Add(float64(p.Deleted))
		if !p.More {
			return total, nil
		}
		after = p.Last
	}
}
