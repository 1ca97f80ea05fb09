package lock

import (
	"context"
	"time"
)

// Lease issues leases on named locks. A Lease is safe for concurrent use:
// any number of goroutines may acquire through one Lease, and acquisitions
// through one Lease exclude each other exactly as those through two
// replicas' do. Every backend guarantees:
//
//   - Exclusion: while a lease on name is held and trusted (Held.Context
//     not done, before Held.TrustedUntil), no other acquisition of name
//     succeeds.
//   - Tokens: each acquisition of name gets a fencing token strictly
//     greater than every token issued for name before it, and greater
//     than Options.Floor, also after the backend lost its state.
//   - Wake-on-release: a waiting Acquire tries again as soon as the holder
//     releases, not after a retry interval or a TTL.
//   - Expiry: a lease not extended (its holder stopped or cut off) expires
//     within its TTL, and the holder's trust deadline passes before
//     another acquisition can succeed.
//   - Holder: who holds name is the holder's Options.Instance (outboxd's
//     instance_id) beside its owner value.
type Lease interface {
	// Acquire waits for name until it is obtained, opts.Wait passes or ctx
	// is done. A refusal wraps ErrNotObtained (a *HolderError when another
	// owner held it on the last attempt, see HeldElsewhere), joined with
	// the wait's context error and the backend's last error. Corrupted
	// backend state (ErrCorrupt, not ErrNotObtained) ends the wait early
	// when no retry can cure it. ctx bounds the wait only: the Held's
	// Context keeps ctx's values, not its cancellation. Every Held must be
	// released.
	Acquire(ctx context.Context, name string, opts Options) (Held, error)
	// TryAcquire makes one attempt and does not wait. Its errors are
	// Acquire's.
	TryAcquire(ctx context.Context, name string, opts Options) (Held, error)
	// Holder reports name's current holder; Owner is "" when it is free.
	// An error matching ErrCorrupt names what must be repaired.
	Holder(ctx context.Context, name string) (HolderInfo, error)
	// LastToken is the backend's token counter for name: the last token it
	// issued, 0 when none since it last lost its state. An error matching
	// ErrCorrupt names what must be repaired.
	LastToken(ctx context.Context, name string) (int64, error)
}

// Held is one acquisition of a lock. Its methods may be called from any
// goroutine. The backend renews it (a watchdog every
// Options.RenewInterval) until Release, which its acquirer must call once
// the work is done (further calls return the first result).
type Held interface {
	// Token is this acquisition's fencing token (see Lease).
	Token() int64
	// Owner is this acquisition's owner value, unique per acquisition.
	Owner() string
	// Recovered reports that the token was lifted by Options.Floor because
	// the backend had lost the lock's state: a predecessor may not have
	// noticed yet and can act until its trust deadline, at most one TTL.
	Recovered() bool
	// Context is cancelled with cause ErrLost the moment a renewal finds
	// the lease gone or owned by another, or the trust deadline passes;
	// with cause ErrReleased after Release. All work done as holder runs
	// in it.
	Context() context.Context
	// TrustedUntil is the local trust deadline, on this process' monotonic
	// clock: past it the lease may have expired in the backend and the
	// holder must not act.
	TrustedUntil() time.Time
	// Extend renews the lease once, owner-checked, and moves the trust
	// deadline. A lease found gone, another's or corrupted is lost: the
	// error and the Context's cause match ErrLost.
	Extend(ctx context.Context) error
	// Release stops the renewals, cancels the Context (ErrReleased) and
	// ends the lease in the backend only if it is still this owner's,
	// waking waiters. It returns ErrNotHeld or ErrOwnedByOther when the
	// lease had already gone; it never ends another owner's lease.
	Release(ctx context.Context) error
}

// HolderInfo describes a lock's current holder.
type HolderInfo struct {
	Owner    string        // the holder's owner value; "" when the lock is free
	Instance string        // the holder's Options.Instance; "" when unknown
	TTL      time.Duration // time left on its lease
}

// Hooks observe lock events (for metrics). Any field may be nil. Backends
// call them on their own goroutines; they must not block.
type Hooks struct {
	Acquired    func(name string, token int64, waited time.Duration)
	Released    func(name string)
	Lost        func(name string, cause error)
	RenewFailed func(name string, err error)
}
