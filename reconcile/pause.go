package reconcile

import (
	"context"
	"time"

	"github.com/outboxd/outboxd/internal/term"
	"github.com/outboxd/outboxd/store"
)

// Pause pauses the destinations names (store.PauseDestinations) under a
// term of lock:reconciliation, waiting up to wait for the lock, as Replay
// does: a fenced write, refused (store.ErrStaleFence) once a newer holder
// took the lock over. It returns those not paused before and the pause
// generation written.
func (r *Reconciler) Pause(ctx context.Context, names []string, wait time.Duration) (store.Switched, error) {
	return r.fencedOnce(ctx, wait, func(ctx context.Context, f store.Fence) (store.Switched, error) {
		return r.store.PauseDestinations(ctx, f, names)
	})
}

// Resume resumes the destinations names, or every paused one when all
// (store.ResumeDestinations), under a term of lock:reconciliation as Pause.
// It returns those it resumed (with all, configured or not) and the pause
// generation written.
func (r *Reconciler) Resume(ctx context.Context, names []string, all bool, wait time.Duration) (store.Switched, error) {
	return r.fencedOnce(ctx, wait, func(ctx context.Context, f store.Fence) (store.Switched, error) {
		return r.store.ResumeDestinations(ctx, f, store.Resume{Names: names, All: all})
	})
}

// fencedOnce runs one fenced write under a term of lock:reconciliation.
func (r *Reconciler) fencedOnce(ctx context.Context, wait time.Duration, write func(context.Context, store.Fence) (store.Switched, error)) (store.Switched, error) {
	var n store.Switched
	err := r.seat.Run(ctx, wait, func(tctx context.Context, t *term.Term) error {
		var err error
		n, err = write(tctx, t.Fence())
		return err
	})
	return n, err
}
