package reconcile

import (
	"context"
	"errors"
	"time"

	"github.com/outboxd/outboxd/internal/term"
	"github.com/outboxd/outboxd/store"
)

// DefaultReplayLockWait is how long `outboxd replay` waits for
// lock:reconciliation when not told otherwise (its --lock-wait): longer than
// a scheduled run usually holds it (batched sweeps), short enough for a
// command an operator waits on.
const DefaultReplayLockWait = 30 * time.Second

// Replay requeues f's dead rows (store.Reconcile.ReplayDead) under a term of
// lock:reconciliation, waiting up to wait for the lock: replays are fenced
// writes like every other, so a replay cannot interleave with a sweep that
// purges dead rows, and a replay whose term was taken over (a lease lost to
// a pause) changes nothing more. It returns how many rows it requeued, also
// when it stopped early: then with store.ErrStaleFence (taken over), the
// term's cause (lock.ErrLost) or ctx's (interrupted: it stops after the
// batch in flight, not after the shutdown timeout). A lock held elsewhere past wait
// is an error wrapping lock.ErrNotObtained (a *lock.HolderError names the
// holder); nothing was requeued then.
func (r *Reconciler) Replay(ctx context.Context, f store.ReplayFilter, wait time.Duration, progress func(requeued int64)) (int64, error) {
	return r.deadWrite(ctx, wait, func(wctx context.Context, fence store.Fence, batchDone func()) (int64, error) {
		return r.store.ReplayDead(wctx, fence, store.Replay{Filter: f, BatchSize: r.cfg.BatchSize, Progress: func(done int64) {
			if progress != nil {
				progress(done)
			}
			batchDone()
		}})
	})
}

// Discard deletes f's dead rows (store.Reconcile.DiscardDead) under a term of
// lock:reconciliation, as Replay requeues them: fenced, waiting up to wait
// for the lock, stopping after the batch in flight when ctx ends, and
// returning how many it deleted, also when it stopped early. removed gets
// each batch's rows.
func (r *Reconciler) Discard(ctx context.Context, f store.DeadFilter, wait time.Duration, removed func([]store.Discarded)) (int64, error) {
	return r.deadWrite(ctx, wait, func(wctx context.Context, fence store.Fence, batchDone func()) (int64, error) {
		return r.store.DiscardDead(wctx, fence, store.Discard{Filter: f, BatchSize: r.cfg.BatchSize, Removed: func(rows []store.Discarded) {
			if removed != nil {
				removed(rows)
			}
			batchDone()
		}})
	})
}

// deadWrite runs write, a batched fenced write over dead rows, under a
// term of lock:reconciliation; write calls batchDone after each batch.
func (r *Reconciler) deadWrite(ctx context.Context, wait time.Duration, write func(wctx context.Context, fence store.Fence, batchDone func()) (int64, error)) (int64, error) {
	var n int64
	err := r.seat.Run(ctx, wait, func(tctx context.Context, t *term.Term) error {
		// The term outlives ctx by the shutdown timeout (in-flight work);
		// an interrupted write stops after the batch in flight instead,
		// never within one: a statement cancelled as it commits would
		// leave the count it reports short of what it changed.
		wctx, cancel := context.WithCancelCause(tctx)
		defer cancel(nil)
		var err error
		n, err = write(wctx, t.Fence(), func() {
			if ctx.Err() != nil {
				cancel(context.Cause(ctx))
			}
		})
		if err != nil && wctx.Err() != nil {
			err = errors.Join(err, context.Cause(wctx)) // "lock lost" is logged on release
		}
		return err
	})
	return n, err
}
