package hold

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"
)

// Attempt is one try at a lock: the lock on success; final says no retry
// can repair the failure, and its error ends the wait as it is.
type Attempt[L any] func() (l L, final bool, err error)

// Wait is the wait every backend's Acquire shares once its first attempt
// found the lock taken (first is that attempt's error). It tries again on
// each wake (a release the backend announces) and otherwise every interval
// plus up to as much jitter, until an attempt succeeds or is final, or ctx
// is done. A closed wake channel stops the wakes and leaves the timer.
// Its guarantee: on ctx's end the error is the last attempt's that ctx did
// not cut short (a cut-short attempt learned nothing), joined with ctx's
// cause. Backends that start listening after the first attempt call it
// with atOnce, so a release between the two is caught by an attempt made
// at once.
func Wait[L, W any](ctx context.Context, interval time.Duration, first error, wake <-chan W, atOnce bool, try Attempt[L]) (L, error) {
	lastErr := first
	if atOnce {
		if l, done, err := settle(ctx, try, &lastErr); done {
			return l, err
		}
	}
	for {
		jitter := time.Duration(rand.Int64N(int64(interval) + 1))
		t := time.NewTimer(interval + jitter)
		select {
		case <-ctx.Done():
			t.Stop()
			var zero L
			return zero, errors.Join(lastErr, context.Cause(ctx))
		case _, ok := <-wake:
			if !ok {
				wake = nil
			}
		case <-t.C:
		}
		t.Stop()
		if l, done, err := settle(ctx, try, &lastErr); done {
			return l, err
		}
	}
}

// settle makes one attempt: done when it succeeded or is final; otherwise
// its error replaces *lastErr unless ctx cut it short.
func settle[L any](ctx context.Context, try Attempt[L], lastErr *error) (L, bool, error) {
	l, final, err := try()
	if err == nil || final {
		return l, true, err
	}
	if ctx.Err() == nil {
		*lastErr = err
	}
	return l, false, nil
}
