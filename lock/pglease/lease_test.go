package pglease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/lock"
	"github.com/outboxd/outboxd/lock/pglease"
)

// A deployment switching to the Postgres lease from another backend: the
// first token is above the highest token Postgres accepted (outbox_fence),
// though the lease table has never seen the lock and the caller passes no
// floor, and it is Recovered (a predecessor on the old backend may act
// until its TTL ends).
func TestTokenRisesAboveTheFence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := testenv.DSN(t)
	admin := pool(t, dsn, false)
	const name = "lock:outbox:poller"
	if _, err := admin.Exec(ctx, `INSERT INTO outbox_fence (lock_name, token) VALUES ($1, 4711)`, name); err != nil {
		t.Fatal(err)
	}
	l := pglease.New(pool(t, dsn, false))
	h, err := l.Acquire(ctx, name, lock.Options{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if h.Token() <= 4711 || !h.Recovered() {
		t.Fatalf("token %d (recovered %t), want above the fence's 4711, recovered", h.Token(), h.Recovered())
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// A fence raised past the lease's counter (a writer of the old backend
	// still at work) lifts the next token again.
	if _, err := admin.Exec(ctx, `UPDATE outbox_fence SET token = 9000 WHERE lock_name = $1`, name); err != nil {
		t.Fatal(err)
	}
	h, err = l.Acquire(ctx, name, lock.Options{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Release(ctx) }()
	if h.Token() <= 9000 {
		t.Fatalf("token %d, want above the fence's 9000", h.Token())
	}
	if n, err := l.LastToken(ctx, name); err != nil || n != h.Token() {
		t.Fatalf("LastToken %d %v, want %d", n, err, h.Token())
	}
}

// Behind PgBouncer in transaction mode, without LISTEN: the lease is
// taken, named, renewed and released, a waiter polling at its retry
// interval gets it after the release, and a stopped holder's lease
// expires on Postgres' clock.
func TestBehindTransactionPooler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := testenv.DSN(t)
	via := testenv.StartPgBouncer(t, dsn).Via(dsn)
	a := pglease.New(pool(t, via, true), pglease.WithoutListen())
	b := pglease.New(pool(t, via, true), pglease.WithoutListen())
	const name = "lock:outbox:poller"

	ha, err := a.Acquire(ctx, name, lock.Options{TTL: time.Minute, Instance: "replica-a"})
	if err != nil {
		t.Fatal(err)
	}
	if hi, err := b.Holder(ctx, name); err != nil || hi.Instance != "replica-a" || hi.Owner != ha.Owner() {
		t.Fatalf("holder %+v %v, want replica-a", hi, err)
	}
	if err := ha.Extend(ctx); err != nil {
		t.Fatalf("extend: %v", err)
	}
	type result struct {
		h   lock.Held
		err error
	}
	got := make(chan result, 1)
	go func() {
		h, err := b.Acquire(ctx, name, lock.Options{TTL: 2 * time.Second, RenewInterval: -1, Wait: time.Minute, Instance: "replica-b"})
		got <- result{h, err}
	}()
	if err := ha.Release(ctx); err != nil {
		t.Fatalf("release: %v", err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("waiter: %v", r.err)
	}
	if r.h.Token() <= ha.Token() {
		t.Fatalf("waiter's token %d after %d", r.h.Token(), ha.Token())
	}
	// b's holder stops renewing (RenewInterval -1): a takes over once
	// Postgres' clock passes its TTL, and b's lease is lost.
	hc, err := a.Acquire(ctx, name, lock.Options{TTL: time.Minute, Wait: time.Minute, Instance: "replica-a"})
	if err != nil {
		t.Fatalf("after the stopped holder's TTL: %v", err)
	}
	defer func() { _ = hc.Release(ctx) }()
	if err := r.h.Extend(ctx); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("stopped holder's Extend: %v, want ErrLost", err)
	}
}
