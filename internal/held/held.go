// Package held gives every holder of a lock (the poller, the reconciler) the
// same lifecycle: the contract's "lock acquired" / "lock lost" / "lock
// released" log lines,
// the token published for /status while held, and an owner-checked release on
// a short context detached from the caller's cancellation, so a lock is
// handed over even during shutdown.
package held

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/outboxd/outboxd/lock"
)

// releaseTimeout bounds the release: past it the lease simply expires.
const releaseTimeout = 2 * time.Second

// Announce logs the acquisition, stores the token in token (read by /status),
// and returns the logger to use while holding and the release to defer.
func Announce(ctx context.Context, log *slog.Logger, l *lock.Lock, token *atomic.Int64) (*slog.Logger, func()) {
	log = log.With("fencing_token", l.Token())
	log.Info("lock acquired")
	token.Store(l.Token())
	return log, func() {
		token.Store(0)
		// However the holder stopped (a refused write, a failed batch, its
		// own check), a lost lease is reported here, once.
		cause := context.Cause(l.Context())
		lost := errors.Is(cause, lock.ErrLost)
		switch {
		case lost && errors.Is(cause, lock.ErrCorrupt):
			log.Error("lock lost", "error", cause) // an operator must repair Redis
		case lost:
			log.Warn("lock lost", "error", cause)
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
		if err := l.Release(rctx); err != nil {
			if !lost && !errors.Is(err, lock.ErrNotHeld) {
				log.Warn("lock release failed", "error", err)
			}
			return
		}
		log.Info("lock released")
	}
}
