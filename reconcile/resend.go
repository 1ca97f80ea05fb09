package reconcile

import (
	"context"
	"time"

	"github.com/outboxd/outboxd/store"
)

// Resend copies f's delivered rows as new pending rows (store.Resend),
// at most limit (0: no bound), under a term of lock:reconciliation,
// waiting up to wait for the lock, as Replay requeues dead rows: fenced,
// stopping after the batch in flight when ctx ends. It returns the pairs
// (original, copy) it wrote, also when it stopped early.
func (r *Reconciler) Resend(ctx context.Context, f store.ResendFilter, limit int, wait time.Duration) ([]store.ResentCopy, error) {
	out := []store.ResentCopy{}
	_, err := r.deadWrite(ctx, wait, func(wctx context.Context, fence store.Fence, batchDone func()) (int64, error) {
		return r.store.Resend(wctx, fence, store.ResendBatch{Filter: f, Limit: limit, BatchSize: r.cfg.BatchSize, Copied: func(cs []store.ResentCopy) {
			out = append(out, cs...)
			batchDone()
		}})
	})
	return out, err
}

// Retention is how long delivered rows are kept (reconcile.retention):
// older ones are purged and cannot be resent.
func (r *Reconciler) Retention() time.Duration { return r.cfg.Retention }
