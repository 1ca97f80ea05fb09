// Package lock is the lease outboxd holds a lock with: named locks, one
// holder at a time, and a fencing token per acquisition.
//
// Lease and Held are the seam; a backend implements them in its own
// subpackage (lock/redislease: Redis, single, Sentinel, Cluster or
// Redlock). This package holds what every backend shares and what every
// caller tells apart: the interfaces, Options and their defaults, Hooks for
// metrics, and the errors (ErrNotObtained with a *HolderError naming the
// holder, ErrLost, ErrNotHeld, ErrOwnedByOther, ErrReleased, ErrCorrupt
// with a *CorruptError naming the repair). lock/leasetest is the
// conformance suite every backend runs.
//
// What every backend guarantees is written on Lease and Held. What none
// does: a lease alone cannot stop a holder that is paused (GC, SIGSTOP, a
// slow network) between checking its lease and acting on it. Only the
// resource can refuse a stale holder; in outboxd that is Postgres'
// outbox_fence row, checked on every write (package store). Treat the
// token as the authority and the lease as an optimisation that keeps the
// holders few.
package lock
