package reconcile

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxd/outboxd/internal/keys"
	"github.com/outboxd/outboxd/lock"
	"github.com/outboxd/outboxd/lock/redislease"
)

// While a reconciliation holds lock:reconciliation, the lock names the
// replica's instance_id as its holder: what `outboxd status` and /status
// read (lock.Client.Holder) to show who runs it.
func TestReconciliationHolderIsNamedByInstanceID(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ids := e.insertPending(1)
	e.markKeyDelivered(ids[0]) // the mark sweep has a write to make: its hook runs under the lock
	r := e.reconciler(Config{Instance: "reconciler-7"})
	locks := redislease.New([]redis.UniversalClient{e.rdb}, redislease.WithKeyPrefix(e.prefix))
	var h lock.HolderInfo
	var herr error
	ran := false
	r.hooks.beforeMark = func(ctx context.Context) {
		ran = true
		h, herr = locks.Holder(ctx, keys.ReconcileLock)
	}
	if _, err := r.RunOnce(context.Background(), time.Now(), time.Second); err != nil {
		t.Fatal(err)
	}
	if !ran {
		t.Fatal("the mark sweep never ran under the lock")
	}
	if herr != nil || h.Owner == "" || h.Instance != "reconciler-7" {
		t.Fatalf("holder while the reconciliation runs: %+v, %v; want instance reconciler-7", h, herr)
	}
}
