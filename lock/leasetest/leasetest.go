// Package leasetest is the conformance suite every lock.Lease backend
// passes. A backend's tests call Run with a way to make a fresh Subject;
// the suite checks what lock.Lease and lock.Held promise: exclusion with
// the holder named, tokens that only rise and stay above the floor,
// wake-on-release, renewal by Extend and by the watchdog, the lost-lease
// signal, owner-checked release, the holder record, and expiry of a lease
// nobody renews. Only tests import it.
package leasetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/outboxd/outboxd/lock"
)

// Subject is one backend under test, on a namespace of its own (a key
// prefix, a schema, a directory): locks there are unseen by other tests.
type Subject struct {
	// Replica returns a Lease on the namespace as one more replica sees it:
	// locks taken through any two of them exclude each other.
	Replica func() lock.Lease
	// Remove deletes lock name's lease in the backend behind its holder's
	// back, as an expiry or a loss of data would; the token counter stays.
	Remove func(ctx context.Context, name string) error
	// Steal gives lock name's lease to another owner behind its holder's
	// back.
	Steal func(ctx context.Context, name string) error
	// Waiting reports whether an Acquire of name waits for a release
	// (Redis: it listens on the release channel). Optional: without it the
	// wake-on-release case gives the waiter a moment to start waiting, and
	// may pass without testing the wake when the machine is slow.
	Waiting func(ctx context.Context, name string) bool
}

// long is a TTL no case waits out: a lease of that length ends only by
// release, sabotage or a bug.
const long = time.Minute

// name is the lock every case takes (the Subject's namespace is fresh).
const name = "lock:conformance"

// Run runs the suite. newSubject is called once per case, each case in
// parallel with the others.
func Run(t *testing.T, newSubject func(t *testing.T) Subject) {
	cases := []struct {
		name string
		run  func(t *testing.T, s Subject)
	}{
		{"ExclusiveNamesTheHolder", exclusive},
		{"TokensRiseAboveTheFloor", tokens},
		{"WaiterWakesOnRelease", wakeOnRelease},
		{"ExtendRenewsTheLease", extend},
		{"WatchdogKeepsTheLease", watchdog},
		{"LostWhenRemoved", func(t *testing.T, s Subject) { lostBehindItsBack(t, s, s.Remove) }},
		{"LostWhenStolen", func(t *testing.T, s Subject) { lostBehindItsBack(t, s, s.Steal) }},
		{"ReleaseByNonOwnerChangesNothing", nonOwnerRelease},
		{"HolderNamesInstanceAndTTL", holder},
		{"UnrenewedLeaseExpires", unrenewedExpires},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t, newSubject(t))
		})
	}
}

func acquire(t *testing.T, l lock.Lease, opts lock.Options) lock.Held {
	t.Helper()
	if opts.Wait == 0 {
		opts.Wait = long // a loaded machine may take a while; a free lock is obtained at once
	}
	h, err := l.Acquire(context.Background(), name, opts)
	if err != nil {
		t.Fatalf("acquire %s as %q: %v", name, opts.Instance, err)
	}
	return h
}

func release(t *testing.T, h lock.Held) {
	t.Helper()
	if err := h.Release(context.Background()); err != nil {
		t.Fatalf("release: %v", err)
	}
}

// await polls cond until it holds or limit passes.
func await(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", limit, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// wantHeldBy checks that a refused acquisition says who holds the lock:
// ErrNotObtained, a *lock.HolderError naming h's owner, instance and a
// TTL, and no Held.
func wantHeldBy(t *testing.T, step string, got lock.Held, err error, h lock.Held, instance string) {
	t.Helper()
	var he *lock.HolderError
	switch {
	case got != nil:
		t.Fatalf("%s: a refused acquisition returned a Held (%v)", step, got)
	case !errors.Is(err, lock.ErrNotObtained) || !errors.As(err, &he) || !lock.HeldElsewhere(err):
		t.Fatalf("%s: %v, want ErrNotObtained with a HolderError", step, err)
	case he.Owner != h.Owner() || he.Instance != instance || he.TTL <= 0:
		t.Fatalf("%s: %+v, want owner %s, instance %s and a TTL", step, he, h.Owner(), instance)
	}
}

// exclusive: while one replica holds the lock, another's attempt fails at
// once, and its wait ends with the wait's deadline, naming the holder.
func exclusive(t *testing.T, s Subject) {
	a, b := s.Replica(), s.Replica()
	ha := acquire(t, a, lock.Options{TTL: long, Instance: "replica-a"})
	defer release(t, ha)

	got, err := b.TryAcquire(context.Background(), name, lock.Options{TTL: long, Instance: "replica-b"})
	wantHeldBy(t, "TryAcquire", got, err, ha, "replica-a")

	got, err = b.Acquire(context.Background(), name, lock.Options{TTL: long, Wait: 300 * time.Millisecond, Instance: "replica-b"})
	wantHeldBy(t, "Acquire", got, err, ha, "replica-a")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire: %v, want the wait's deadline joined", err)
	}
	if err := ha.Context().Err(); err != nil {
		t.Fatalf("holder's context done after refusing another: %v", context.Cause(ha.Context()))
	}
}

// tokens: every acquisition's token is above the last; a floor above the
// counter lifts it (Recovered) and the counter keeps the lifted value; a
// floor below it changes nothing; LastToken is the last token issued.
func tokens(t *testing.T, s Subject) {
	l := s.Replica()
	ctx := context.Background()
	if n, err := l.LastToken(ctx, name); err != nil || n != 0 {
		t.Fatalf("LastToken of a fresh lock: %d %v, want 0", n, err)
	}
	var last int64
	for i := range 20 {
		h := acquire(t, l, lock.Options{TTL: long, RenewInterval: -1})
		if h.Token() <= last || h.Recovered() {
			t.Fatalf("acquisition %d: token %d (recovered %t) after %d", i, h.Token(), h.Recovered(), last)
		}
		last = h.Token()
		release(t, h)
	}
	floor := last + 1000
	h := acquire(t, l, lock.Options{TTL: long, RenewInterval: -1, Floor: floor})
	if h.Token() <= floor || !h.Recovered() {
		t.Fatalf("with floor %d: token %d (recovered %t), want above the floor, recovered", floor, h.Token(), h.Recovered())
	}
	last = h.Token()
	release(t, h)
	h = acquire(t, l, lock.Options{TTL: long, RenewInterval: -1, Floor: last - 5})
	if h.Token() <= last || h.Recovered() {
		t.Fatalf("after the floor: token %d (recovered %t) after %d, want above it, not recovered", h.Token(), h.Recovered(), last)
	}
	defer release(t, h)
	if n, err := l.LastToken(ctx, name); err != nil || n != h.Token() {
		t.Fatalf("LastToken: %d %v, want %d", n, err, h.Token())
	}
}

// wakeOnRelease: a waiter that does not retry within its wait, nor within
// the holder's TTL, gets the lock only if the release wakes it.
func wakeOnRelease(t *testing.T, s Subject) {
	a, b := s.Replica(), s.Replica()
	ha := acquire(t, a, lock.Options{TTL: long, Instance: "replica-a"})

	type result struct {
		h   lock.Held
		err error
	}
	got := make(chan result, 1)
	go func() {
		h, err := b.Acquire(context.Background(), name, lock.Options{
			TTL: long, Instance: "replica-b", Wait: long / 2, RetryInterval: long,
		})
		got <- result{h, err}
	}()
	if s.Waiting != nil {
		await(t, long/4, "the waiter to wait", func() bool { return s.Waiting(context.Background(), name) })
	} else {
		time.Sleep(time.Second)
	}
	release(t, ha)
	if cause := context.Cause(ha.Context()); !errors.Is(cause, lock.ErrReleased) {
		t.Fatalf("holder's context cause after Release: %v, want ErrReleased", cause)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("waiter: %v, want the lock once released", r.err)
	}
	defer release(t, r.h)
	if r.h.Token() <= ha.Token() {
		t.Fatalf("waiter's token %d, holder's %d", r.h.Token(), ha.Token())
	}
}

// extend: Extend renews the lease in the backend (its TTL starts again)
// and moves the trust deadline.
func extend(t *testing.T, s Subject) {
	const ttl = 10 * time.Second
	l := s.Replica()
	ctx := context.Background()
	h := acquire(t, l, lock.Options{TTL: ttl, RenewInterval: -1, Instance: "replica-a"})
	defer release(t, h)
	trusted := h.TrustedUntil()
	var before time.Duration
	await(t, ttl, "3 s of the lease to pass", func() bool {
		hi, err := l.Holder(ctx, name)
		before = hi.TTL
		return err == nil && hi.TTL < ttl-3*time.Second
	})
	if err := h.Extend(ctx); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	if !h.TrustedUntil().After(trusted) {
		t.Fatalf("trust deadline %v after Extend, was %v", h.TrustedUntil(), trusted)
	}
	hi, err := l.Holder(ctx, name)
	if err != nil || hi.Owner != h.Owner() || hi.TTL <= before {
		t.Fatalf("after Extend: holder %+v %v, want ours with more than the %s left before", hi, err, before)
	}
}

// watchdog: a held lease renews itself past several TTLs.
func watchdog(t *testing.T, s Subject) {
	const ttl = 5 * time.Second
	a, b := s.Replica(), s.Replica()
	h := acquire(t, a, lock.Options{TTL: ttl, Instance: "replica-a"})
	defer release(t, h)
	time.Sleep(2*ttl + 100*time.Millisecond) // the lease would have expired twice over
	if err := h.Context().Err(); err != nil {
		t.Fatalf("lost while the watchdog renews: %v", context.Cause(h.Context()))
	}
	got, err := b.TryAcquire(context.Background(), name, lock.Options{TTL: long, Instance: "replica-b"})
	wantHeldBy(t, "after two TTLs", got, err, h, "replica-a")
}

// lostBehindItsBack: when the lease is removed or taken behind the
// holder's back, the next renewal finds out: Extend fails with ErrLost,
// and the watchdog cancels the Context with ErrLost well before the trust
// deadline.
func lostBehindItsBack(t *testing.T, s Subject, sabotage func(context.Context, string) error) {
	l := s.Replica()
	ctx := context.Background()

	h := acquire(t, l, lock.Options{TTL: long, RenewInterval: -1})
	if err := sabotage(ctx, name); err != nil {
		t.Fatalf("sabotage: %v", err)
	}
	if err := h.Extend(ctx); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Extend after sabotage: %v, want ErrLost", err)
	}
	if cause := context.Cause(h.Context()); !errors.Is(cause, lock.ErrLost) {
		t.Fatalf("context cause after a failed Extend: %v, want ErrLost", cause)
	}
	if err := h.Release(ctx); err == nil {
		t.Fatal("Release of a lost lease: nil, want ErrNotHeld or ErrOwnedByOther")
	}
	if err := s.Remove(ctx, name); err != nil {
		t.Fatalf("clear: %v", err)
	}

	h = acquire(t, l, lock.Options{TTL: long, RenewInterval: 100 * time.Millisecond})
	defer func() { _ = h.Release(ctx) }()
	trusted := h.TrustedUntil()
	if err := sabotage(ctx, name); err != nil {
		t.Fatalf("sabotage: %v", err)
	}
	select {
	case <-h.Context().Done():
	case <-time.After(time.Until(trusted)):
		t.Fatal("the watchdog did not notice before the trust deadline")
	}
	if cause := context.Cause(h.Context()); !errors.Is(cause, lock.ErrLost) {
		t.Fatalf("context cause: %v, want ErrLost", cause)
	}
}

// nonOwnerRelease: a holder whose lease is gone and taken by another can
// neither release nor extend the newcomer's.
func nonOwnerRelease(t *testing.T, s Subject) {
	a, b, c := s.Replica(), s.Replica(), s.Replica()
	ctx := context.Background()
	stale := acquire(t, a, lock.Options{TTL: long, RenewInterval: -1, Instance: "replica-a"})
	if err := s.Remove(ctx, name); err != nil { // as if it expired
		t.Fatalf("remove: %v", err)
	}
	hb := acquire(t, b, lock.Options{TTL: long, Instance: "replica-b"})
	defer release(t, hb)

	if err := stale.Extend(ctx); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("stale Extend: %v, want ErrLost", err)
	}
	if err := stale.Release(ctx); !errors.Is(err, lock.ErrOwnedByOther) {
		t.Fatalf("stale Release: %v, want ErrOwnedByOther", err)
	}
	if hi, err := c.Holder(ctx, name); err != nil || hi.Owner != hb.Owner() || hi.Instance != "replica-b" {
		t.Fatalf("holder after a stale release: %+v %v, want replica-b's", hi, err)
	}
	if err := hb.Extend(ctx); err != nil {
		t.Fatalf("holder's Extend after a stale release: %v", err)
	}
	if err := hb.Context().Err(); err != nil {
		t.Fatalf("holder's context after a stale release: %v", context.Cause(hb.Context()))
	}
	got, err := c.TryAcquire(ctx, name, lock.Options{TTL: long, Instance: "replica-c"})
	wantHeldBy(t, "third replica", got, err, hb, "replica-b")
}

// holder: Holder names the holder's instance beside its owner and the TTL
// left, and reports a free lock as free.
func holder(t *testing.T, s Subject) {
	a, b := s.Replica(), s.Replica()
	ctx := context.Background()
	if hi, err := b.Holder(ctx, name); err != nil || hi != (lock.HolderInfo{}) {
		t.Fatalf("free lock: %+v %v, want no holder", hi, err)
	}
	h := acquire(t, a, lock.Options{TTL: long, Instance: "replica-a"})
	hi, err := b.Holder(ctx, name)
	if err != nil || hi.Owner != h.Owner() || hi.Instance != "replica-a" || hi.TTL <= 0 || hi.TTL > long {
		t.Fatalf("held: %+v %v, want owner %s, instance replica-a, a TTL in (0, %s]", hi, err, h.Owner(), long)
	}
	release(t, h)
	if hi, err := b.Holder(ctx, name); err != nil || hi.Owner != "" {
		t.Fatalf("after release: %+v %v, want no holder", hi, err)
	}
	if n, err := b.LastToken(ctx, name); err != nil || n != h.Token() {
		t.Fatalf("LastToken after release: %d %v, want %d", n, err, h.Token())
	}
}

// unrenewedExpires: a lease nobody renews (its holder stopped) expires
// within its TTL, another replica gets it, and by then the stale holder's
// trust deadline has passed and its Context says ErrLost.
func unrenewedExpires(t *testing.T, s Subject) {
	const ttl = 5 * time.Second
	a, b := s.Replica(), s.Replica()
	stale := acquire(t, a, lock.Options{TTL: ttl, RenewInterval: -1, Instance: "replica-a"})
	hb := acquire(t, b, lock.Options{TTL: long, Instance: "replica-b"})
	obtained := time.Now()
	defer release(t, hb)
	if !obtained.After(stale.TrustedUntil()) {
		t.Fatalf("obtained at %v, before the stale holder's trust deadline %v", obtained, stale.TrustedUntil())
	}
	if hb.Token() <= stale.Token() {
		t.Fatalf("token %d after %d", hb.Token(), stale.Token())
	}
	select {
	case <-stale.Context().Done():
	case <-time.After(long):
		t.Fatal("stale holder's context not done")
	}
	if cause := context.Cause(stale.Context()); !errors.Is(cause, lock.ErrLost) {
		t.Fatalf("stale holder's context cause: %v, want ErrLost", cause)
	}
	_ = stale.Release(context.Background()) // ErrOwnedByOther: it is replica-b's now
}
