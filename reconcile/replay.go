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

// Replay requeues f's dead rows (store.ReplayDead) under a term of
// lock:reconciliation, waiting up to wait for the lock: replays are fenced
// writes like every other, so a replay cannot interleave with a sweep that
// purges dead rows, and a replay whose term was taken over (a lease lost to
// a pause) changes nothing more. It returns how many rows it requeued, also
// when it stopped early: then with store.ErrStaleFence (taken over) or the
// term's cause (lock.ErrLost, shutdown). A lock held elsewhere past wait
// is an error wrapping lock.ErrNotObtained (a *lock.HolderError names the
// holder); nothing was requeued then.
func (r *Reconciler) Replay(ctx context.Context, f store.ReplayFilter, wait time.Duration, progress func(requeued int64)) (int64, error) {
	var n int64
	err := r.seat.Run(ctx, wait, func(ctx context.Context, t *term.Term) error {
		var err error
		n, err = r.store.ReplayDead(ctx, t.Fence(), f, r.cfg.BatchSize, progress)
		if err != nil && ctx.Err() != nil {
			err = errors.Join(err, context.Cause(ctx)) // "lock lost" is logged on release
		}
		return err
	})
	return n, err
}
