package lock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/lock"
	"github.com/outboxd/outboxd/lock/redislease"
)

// TestMain finds the test Redis (testenv) before the examples run.
func TestMain(m *testing.M) { testenv.Main(m) }

// Two replicas contend for one lock: the first gets a fencing token, the
// second is told who holds it, and the holder releases it.
func ExampleLease() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	defer rdb.Close()
	prefix := "example:" + uuid.NewString() + ":"
	defer rdb.Del(ctx, prefix+"lock:example", prefix+"fence:{"+prefix+"lock:example}", prefix+"holder:{"+prefix+"lock:example}")

	// The Redis lease; every backend is a lock.Lease.
	var leases lock.Lease = redislease.New([]redis.UniversalClient{rdb}, redislease.WithKeyPrefix(prefix))

	held, err := leases.Acquire(ctx, "lock:example", lock.Options{TTL: 30 * time.Second, Instance: "replica-a"})
	if err != nil {
		fmt.Println("not acquired:", err)
		return
	}
	fmt.Println("token above zero:", held.Token() > 0)
	// Work as holder runs in held.Context(): it is cancelled with
	// lock.ErrLost the moment the lease is lost. Every write carries
	// held.Token(), so the resource can refuse a stale holder.

	_, err = leases.TryAcquire(ctx, "lock:example", lock.Options{TTL: 30 * time.Second, Instance: "replica-b"})
	var he *lock.HolderError
	if errors.As(err, &he) {
		fmt.Println("second replica: held by", he.Instance)
	}

	if err := held.Release(ctx); err != nil {
		fmt.Println("release:", err)
	}
	fmt.Println("released:", errors.Is(context.Cause(held.Context()), lock.ErrReleased))
	// Output:
	// token above zero: true
	// second replica: held by replica-a
	// released: true
}
