package lock

import (
	"errors"
	"fmt"
	"time"
)

var (
	// ErrNotObtained: the lock is held by someone else (or the backend did
	// not answer) and the wait ran out.
	ErrNotObtained = errors.New("lock: not obtained")
	// ErrLost: a held lock can no longer be trusted; the cause of a lock's
	// Context once it is lost.
	ErrLost = errors.New("lock: lost")
	// ErrNotHeld: release or extend found the key gone (expired or flushed).
	ErrNotHeld = errors.New("lock: key gone (expired or flushed)")
	// ErrOwnedByOther: release or extend found the key owned by another holder.
	ErrOwnedByOther = errors.New("lock: owned by another holder")
	// ErrReleased is the cause of a lock's Context after Release.
	ErrReleased = errors.New("lock: released")
	// ErrCorrupt: the backend holds lock state that no backend can have
	// written (another type, a non-integer counter, no expiry). Retrying
	// cannot help; an operator must repair it. A *CorruptError says which
	// key, where, what it holds and the fix.
	ErrCorrupt = errors.New("lock: corrupted lock state")
)

// HolderError tells who holds a lock when an attempt fails. It matches
// ErrNotObtained.
type HolderError struct {
	Key      string
	Owner    string        // the holder's owner value
	Instance string        // the holder's Options.Instance; "" when unknown
	TTL      time.Duration // time left on the holder's lease
}

func (e *HolderError) Error() string {
	return fmt.Sprintf("%s is held by %s for %s more", e.Key, e.Holder(), e.TTL.Round(time.Millisecond))
}

// Holder names the holder: "instance <id> (owner <uuid>)", or the owner
// alone when the instance is unknown.
func (e *HolderError) Holder() string {
	if e.Instance == "" {
		return "owner " + e.Owner
	}
	return "instance " + e.Instance + " (owner " + e.Owner + ")"
}

func (e *HolderError) Unwrap() error { return ErrNotObtained }

// HeldElsewhere tells the normal standby case (another owner holds the lock)
// from an outage: ErrNotObtained alone also means that the backend (or too
// few of its nodes) answered. Every failed wait ends in a deadline, so only
// the last attempt's HolderError says which it was.
func HeldElsewhere(err error) bool {
	var h *HolderError
	return errors.As(err, &h)
}

// CorruptError says that a lock key or fence counter holds something no
// backend can have written, where, and how to repair it. It matches
// ErrCorrupt. Backends refuse before their first write, so the key at
// fault and the lock's other state are left as they were.
type CorruptError struct {
	Node  string // the server the key was found on
	Key   string // the key at fault
	Fence bool   // Key is the fence counter; otherwise the lock key
	Holds string // what Key holds: a type ("a hash") or a value cut to 64 bytes
	// Repair is the backend's fix when deleting Key is not it; "" for that.
	Repair string
}

func (e *CorruptError) Error() string {
	what := "lock key"
	if e.Fence {
		what = "fence counter"
	}
	return fmt.Sprintf("%v: %s %s on %s holds %s; %s", ErrCorrupt, what, e.Key, e.Node, e.Holds, e.Fix())
}

// Fix is the operator's repair, to show beside the error.
func (e *CorruptError) Fix() string {
	switch {
	case e.Repair != "":
		return e.Repair
	case e.Fence:
		return "delete " + e.Key + ": the next acquisition restores the counter from the floor"
	}
	return "delete " + e.Key + ": a lease is a string with an expiry, and the next acquisition writes one"
}

func (e *CorruptError) Unwrap() error { return ErrCorrupt }
