// Package term is the one way outboxd holds a lock to act under it: a fenced
// term, in the spirit of client-go's leader election (Run with a callback
// that gets the term's context), with Postgres' fence as the authority.
//
// Seat.Run is the only place that
//   - reads the floor (the highest token Postgres accepted) and acquires the
//     lock with it, so tokens only rise, even after Redis lost its data;
//   - after Redis lost the lock's state, waits one TTL before acting, when
//     asked (the predecessor may act until its trust deadline, at most a TTL);
//   - raises Postgres' fence to the new token before the work starts, so the
//     predecessor's writes are refused from then on;
//   - logs "lock acquired" and, once when the term ends, "lock released"
//     (the key was still ours: a handover) or "lock lost" (any other end,
//     a fence rejection included, counted in outboxd_lock_losses_total);
//     logs and counts "fence rejected"; every line names the token and the
//     holder (Options.Instance);
//   - publishes the token for /status while the term is held;
//   - bounds the work after the caller stops: the term's context is cancelled
//     ShutdownTimeout after the caller's (stop fetching, finish in flight);
//   - releases the lock, owner-checked, on a context detached from the
//     caller's cancellation, so the lock is handed over even at shutdown.
//
// What it does not do: stop a paused holder. Work done under a term must
// carry Term.Fence on every write (package store refuses a stale one) and
// check Term.TrustedUntil before acting outside Postgres.
package term

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/outboxd/outboxd/internal/metrics"
	"github.com/outboxd/outboxd/lock"
	"github.com/outboxd/outboxd/store"
)

// ErrNotAcquired wraps the reasons Run never held a term (the lock held
// elsewhere, Redis or Postgres unreachable, a corrupted lock state); the
// lock's own errors (lock.HolderError, lock.ErrCorrupt) stay matchable.
var ErrNotAcquired = errors.New("term: lock not acquired")

// ErrShutdownTimeout is the cause of a term's context when the work outlived
// ShutdownTimeout after the caller stopped.
var ErrShutdownTimeout = errors.New("term: shutdown timeout")

// releaseTimeout bounds the release: past it the lease simply expires.
const releaseTimeout = 2 * time.Second

// Options configure a seat.
type Options struct {
	TTL  time.Duration // lease
	Wait time.Duration // how long Run waits for the lock by default
	// WaitAfterDataLoss: when Redis lost the lock's state, wait one TTL
	// before raising the fence and working, so a predecessor that has not
	// noticed yet finishes (its trust deadline) first.
	WaitAfterDataLoss bool
	// Backend names where the leases live (lock.backend: redis,
	// postgres), for the log line that says their state was lost.
	Backend string
	// ShutdownTimeout is how long the work goes on after the caller's
	// context ends; 0 means until the work returns.
	ShutdownTimeout time.Duration
	// QueryTimeout bounds the floor read and the fence claim; default TTL.
	QueryTimeout time.Duration
	// Instance names this replica as the holder (instance_id): recorded
	// beside the lock (lock.Options.Instance) and logged as "holder".
	Instance string
	// LogStandby: log INFO "standing by" (holder: the holder's
	// instance_id) when a wait for the lock held by another begins, once
	// per holder until this seat holds a term or the wait ends otherwise.
	LogStandby bool
}

// Deps are what a seat acts on.
type Deps struct {
	Locks   lock.Lease
	Store   *store.Store
	Log     *slog.Logger
	Metrics *metrics.Metrics
}

// Seat is one lock as this replica holds it, one term at a time.
type Seat struct {
	name  string
	opts  Options
	d     Deps
	log   *slog.Logger
	token atomic.Int64
	// standby is the holder "standing by" was last logged for, "" when
	// not standing by; Run's goroutine only (one Run at a time).
	standby string
}

// New returns the seat for lock name.
func New(name string, opts Options, d Deps) *Seat {
	if opts.QueryTimeout <= 0 {
		opts.QueryTimeout = opts.TTL
	}
	return &Seat{name: name, opts: opts, d: d, log: d.Log.With("lock", name)}
}

// Name is the lock's name.
func (s *Seat) Name() string { return s.name }

// Token is the fencing token while a term is held here, 0 otherwise.
func (s *Seat) Token() int64 { return s.token.Load() }

// Term is one held term.
type Term struct {
	l     lock.Held
	fence store.Fence
	log   *slog.Logger
}

// Fence is what every write under the term carries.
func (t *Term) Fence() store.Fence { return t.fence }

// Token is the term's fencing token.
func (t *Term) Token() int64 { return t.fence.Token }

// Log is the seat's logger with the term's lock and fencing_token.
func (t *Term) Log() *slog.Logger { return t.log }

// TrustedUntil is the lease's local trust deadline: act outside Postgres
// only before it (see lock.Held.TrustedUntil).
func (t *Term) TrustedUntil() time.Time { return t.l.TrustedUntil() }

// Run holds one term: it acquires the lock (waiting up to wait, or
// Options.Wait when wait is 0), raises the fence and calls work with the
// term's context, which is cancelled when the lease is lost or
// ShutdownTimeout after ctx ends. When work returns, the lock is released.
//
// Run returns an error wrapping ErrNotAcquired when no term was held, the
// fence claim's error, or work's error. A store.ErrStaleFence from either is
// counted and logged here ("fence rejected"): the term was superseded.
func (s *Seat) Run(ctx context.Context, wait time.Duration, work func(ctx context.Context, t *Term) error) (err error) {
	l, err := s.acquire(ctx, wait)
	if err != nil {
		if !lock.HeldElsewhere(err) {
			s.standby = "" // an outage or a corrupted state: the next wait says so again
		}
		return errors.Join(ErrNotAcquired, err)
	}
	s.standby = ""
	t := &Term{l: l, fence: store.Fence{Lock: s.name, Token: l.Token(), Owner: l.Owner()},
		log: s.log.With("fencing_token", l.Token(), "holder", s.opts.Instance)}
	t.log.Info("lock acquired")
	s.token.Store(l.Token())
	defer func() { s.release(ctx, t, err) }()

	tctx, cancel := context.WithCancelCause(l.Context())
	defer cancel(nil)
	if s.opts.ShutdownTimeout > 0 {
		stop := context.AfterFunc(ctx, func() {
			timer := time.AfterFunc(s.opts.ShutdownTimeout, func() { cancel(ErrShutdownTimeout) })
			context.AfterFunc(tctx, func() { timer.Stop() })
		})
		defer stop()
	}

	if l.Recovered() && s.opts.WaitAfterDataLoss {
		t.log.Warn("lock state lost; waiting one lock TTL before acting", "lock_backend", s.opts.Backend, "wait_ms", s.opts.TTL.Milliseconds())
		select {
		case <-ctx.Done():
			return nil
		case <-tctx.Done():
			return nil // "lock lost" is logged on release
		case <-time.After(s.opts.TTL):
		}
	}
	qctx, qcancel := context.WithTimeout(tctx, s.opts.QueryTimeout)
	err = s.d.Store.ClaimFence(qctx, t.fence)
	qcancel()
	if err == nil {
		err = work(tctx, t)
	}
	if errors.Is(err, store.ErrStaleFence) {
		s.d.Metrics.FenceRejections.WithLabelValues(s.name).Inc()
		t.log.Warn("fence rejected", "error", err)
	}
	return err
}

func (s *Seat) acquire(ctx context.Context, wait time.Duration) (lock.Held, error) {
	qctx, cancel := context.WithTimeout(ctx, s.opts.QueryTimeout)
	floor, err := s.d.Store.FenceToken(qctx, s.name)
	cancel()
	if err != nil {
		return nil, err
	}
	if wait <= 0 {
		wait = s.opts.Wait
	}
	opts := lock.Options{TTL: s.opts.TTL, Wait: wait, Floor: floor, Instance: s.opts.Instance}
	if s.opts.LogStandby {
		opts.Waiting = s.standingBy
	}
	return s.d.Locks.Acquire(ctx, s.name, opts)
}

// standingBy logs "standing by" once per holder while this seat waits.
func (s *Seat) standingBy(h *lock.HolderError) {
	holder := h.Instance
	if holder == "" {
		holder = h.Holder() // a holder that recorded no instance_id: its owner
	}
	if holder == s.standby {
		return
	}
	s.standby = holder
	s.log.Info("standing by", "holder", holder)
}

// release ends the term and says once how it ended: "lock released" when
// the key was still ours and is deleted (a handover), "lock lost" for every
// other end (ended is the error the term ended with): the lease lost (the
// lock's Context), a write refused by the fence (a newer term exists), or
// the key gone, another's or corrupted at release. A loss the lock did not
// report itself (its Lost hook counts those) is counted here, so
// outboxd_lock_losses_total counts every lost term once. A release that
// fails for another reason (Redis unreachable) is logged as such: the
// lease then expires within its TTL.
func (s *Seat) release(ctx context.Context, t *Term, ended error) {
	s.token.Store(0)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	// A loss known before the release is said before it (the release may
	// take up to releaseTimeout); the lock's Lost hook counted its own.
	if cause := context.Cause(t.l.Context()); errors.Is(cause, lock.ErrLost) {
		s.lost(t, cause, false)
		_ = t.l.Release(rctx)
		return
	}
	if errors.Is(ended, store.ErrStaleFence) {
		s.lost(t, ended, true)
		_ = t.l.Release(rctx) // owner-checked: deletes the key only if still ours
		return
	}
	switch err := t.l.Release(rctx); {
	case errors.Is(err, lock.ErrNotHeld), errors.Is(err, lock.ErrOwnedByOther), errors.Is(err, lock.ErrCorrupt):
		s.lost(t, errors.Join(lock.ErrLost, err), true)
	case err != nil:
		t.log.Warn("lock release failed", "error", err)
	default:
		t.log.Info("lock released")
	}
}

// lost logs "lock lost" (ERROR when Redis needs a repair) and, when count
// is set, counts the loss.
func (s *Seat) lost(t *Term, cause error, count bool) {
	if count {
		s.d.Metrics.LockLosses.WithLabelValues(s.name).Inc()
	}
	if errors.Is(cause, lock.ErrCorrupt) {
		t.log.Error("lock lost", "error", cause) // an operator must repair Redis
		return
	}
	t.log.Warn("lock lost", "error", cause)
}

// Hooks keep the lock metrics (held, acquisitions, losses, renewal
// failures, wait) for a lock.Lease.
func Hooks(m *metrics.Metrics) lock.Hooks {
	return lock.Hooks{
		Acquired: func(name string, _ int64, waited time.Duration) {
			m.LockAcquisitions.WithLabelValues(name).Inc()
			m.LockWait.WithLabelValues(name).Observe(waited.Seconds())
			m.LockHeld.WithLabelValues(name).Set(1)
		},
		Released: func(name string) { m.LockHeld.WithLabelValues(name).Set(0) },
		Lost: func(name string, _ error) {
			m.LockLosses.WithLabelValues(name).Inc()
			m.LockHeld.WithLabelValues(name).Set(0)
		},
		RenewFailed: func(name string, _ error) { m.LockRenewFails.WithLabelValues(name).Inc() },
	}
}
