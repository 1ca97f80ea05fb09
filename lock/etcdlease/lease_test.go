package etcdlease_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/outboxd/outboxd/lock"
	"github.com/outboxd/outboxd/lock/etcdlease"
)

const lockName = "lock:outbox:poller"

// An etcd restored from nothing (a fresh data dir, as after a restore from
// an old snapshot or the loss of every member) starts its revision again:
// the floor (the highest token Postgres accepted) keeps the token above
// every token issued before, and the acquisition says it was recovered.
func TestTokenAboveFloorAfterRestoreFromFreshDataDir(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	l := etcdlease.New(srv.newClient(t))
	var last int64
	for range 5 {
		h, err := l.Acquire(ctx(t), lockName, lock.Options{TTL: 5 * time.Second, RenewInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		last = h.Token()
		if err := h.Release(ctx(t)); err != nil {
			t.Fatal(err)
		}
	}

	srv.stop()
	if err := os.RemoveAll(srv.dir); err != nil {
		t.Fatal(err)
	}
	srv.start(t)

	if n, err := l.LastToken(ctx(t), lockName); err != nil || n != 0 {
		t.Fatalf("LastToken on the fresh etcd: %d %v, want 0 (its state is gone)", n, err)
	}
	h, err := l.Acquire(ctx(t), lockName, lock.Options{TTL: 5 * time.Second, RenewInterval: -1, Floor: last})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Release(context.Background()) }()
	if h.Token() <= last || !h.Recovered() {
		t.Fatalf("after the restore: token %d (recovered %t), want above %d, recovered", h.Token(), h.Recovered(), last)
	}
}

// A holder whose etcd stops loses the lease by its trust deadline, before
// etcd could have expired it, and its Context says lock.ErrLost.
func TestLeaseLostWhenServerStops(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	l := etcdlease.New(srv.newClient(t))
	const ttl = 2 * time.Second
	h, err := l.Acquire(ctx(t), lockName, lock.Options{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Release(context.Background()) }()
	srv.stop()
	select {
	case <-h.Context().Done():
	case <-time.After(time.Minute):
		t.Fatal("lease not lost a minute after etcd stopped")
	}
	if cause := context.Cause(h.Context()); !errors.Is(cause, lock.ErrLost) {
		t.Fatalf("cause %v, want lock.ErrLost", cause)
	}
}
