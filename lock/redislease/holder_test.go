package redislease_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/lock"
)

// The holder's instance is recorded beside the lock, not in it: the lock
// key's value stays the owner token; Holder and a refused attempt's
// HolderError name the instance; a record left by an earlier holder is
// never shown for a new one; a record of the wrong type blocks nothing.
func TestHolderNamesTheInstanceBesideTheOwner(t *testing.T) {
	t.Parallel()
	c, rdb, prefix := newClient(t)
	ctx := context.Background()

	a, err := c.TryAcquire(ctx, "lock:h", lock.Options{TTL: 5 * time.Second, Instance: "replica-a"})
	if err != nil {
		t.Fatal(err)
	}
	if v := rdb.Get(ctx, prefix+"lock:h").Val(); v != a.Owner() {
		t.Fatalf("lock key holds %q, want the owner %q alone", v, a.Owner())
	}
	if c.HolderKey("lock:h") != prefix+"holder:{"+prefix+"lock:h}" {
		t.Fatalf("holder key %s: want it in the lock key's hash slot", c.HolderKey("lock:h"))
	}
	h, err := c.Holder(ctx, "lock:h")
	if err != nil || h.Owner != a.Owner() || h.Instance != "replica-a" || h.TTL <= 0 {
		t.Fatalf("Holder: %+v %v, want owner %s, instance replica-a", h, err, a.Owner())
	}
	_, err = c.TryAcquire(ctx, "lock:h", lock.Options{TTL: 5 * time.Second, Instance: "replica-b"})
	var held *lock.HolderError
	if !errors.As(err, &held) || held.Instance != "replica-a" || !strings.Contains(err.Error(), "instance replica-a") {
		t.Fatalf("second acquire: %v, want a HolderError naming instance replica-a", err)
	}
	release(t, a)

	// Without an instance, the earlier record is not taken for the new owner.
	b, err := c.TryAcquire(ctx, "lock:h", lock.Options{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if h, err := c.Holder(ctx, "lock:h"); err != nil || h.Owner != b.Owner() || h.Instance != "" {
		t.Fatalf("Holder after a handover to a holder without instance: %+v %v, want no instance", h, err)
	}
	// A holder that expired (the key gone, its record left) shows no holder.
	if err := rdb.Del(ctx, prefix+"lock:h").Err(); err != nil {
		t.Fatal(err)
	}
	if h, err := c.Holder(ctx, "lock:h"); err != nil || h.Owner != "" || h.Instance != "" {
		t.Fatalf("Holder of a free lock: %+v %v", h, err)
	}
	if err := rdb.Set(ctx, c.HolderKey("lock:h"), "junk", 0).Err(); err != nil {
		t.Fatal(err)
	}
	d, err := c.TryAcquire(ctx, "lock:h", lock.Options{TTL: 5 * time.Second, Instance: "replica-d"})
	if err != nil {
		t.Fatalf("acquire over a holder record of the wrong type: %v", err)
	}
	defer release(t, d)
	if h, err := c.Holder(ctx, "lock:h"); err != nil || h.Instance != "replica-d" {
		t.Fatalf("Holder: %+v %v, want instance replica-d", h, err)
	}
}
