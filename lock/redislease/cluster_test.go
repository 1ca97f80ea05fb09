package redislease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/lock"
	"github.com/outboxd/outboxd/lock/redislease"
)

// A three-master Redis Cluster: the lock key and its fence counter share a
// hash slot whatever the prefix, so the scripts run there.
func TestRedisCluster(t *testing.T) {
	t.Parallel()
	addrs := testenv.StartRedisCluster(t, 3)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	defer rdb.Close()
	ctx := context.Background()

	for _, prefix := range []string{"", "billing:", "{tenant}:"} {
		c := redislease.New([]redis.UniversalClient{rdb}, redislease.WithKeyPrefix(prefix))
		var last int64
		for i := range 5 {
			name := "lock:outbox:poller"
			if i%2 == 1 {
				name = "lock:reconciliation" // another slot
			}
			l, err := c.TryAcquire(ctx, name, lock.Options{TTL: 5 * time.Second})
			if err != nil {
				t.Fatalf("prefix %q: acquire %s: %v", prefix, name, err)
			}
			if name == "lock:outbox:poller" {
				if l.Token() <= last {
					t.Fatalf("prefix %q: token %d after %d", prefix, l.Token(), last)
				}
				last = l.Token()
			}
			if _, err := c.TryAcquire(ctx, name, lock.Options{TTL: time.Second}); !errors.Is(err, lock.ErrNotObtained) {
				t.Fatalf("prefix %q: second holder: %v", prefix, err)
			}
			if err := l.Extend(ctx); err != nil {
				t.Fatalf("prefix %q: extend: %v", prefix, err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatalf("prefix %q: release: %v", prefix, err)
			}
		}
		// Corrupted state is reported through the cluster client too, and
		// nothing is written.
		if err := rdb.Set(ctx, c.FenceKey("lock:bad"), "abc", 0).Err(); err != nil {
			t.Fatal(err)
		}
		var ce *lock.CorruptError
		if _, err := c.TryAcquire(ctx, "lock:bad", lock.Options{TTL: time.Second}); !errors.As(err, &ce) ||
			ce.Key != c.FenceKey("lock:bad") || errors.Is(err, lock.ErrNotObtained) {
			t.Fatalf("prefix %q: corrupt counter: %v, want ErrCorrupt naming %s", prefix, err, c.FenceKey("lock:bad"))
		}
		if n := rdb.Exists(ctx, c.Key("lock:bad")).Val(); n != 0 {
			t.Fatalf("prefix %q: the lock key was written beside a corrupt counter", prefix)
		}
		if slot := func(k string) int64 { return rdb.ClusterKeySlot(ctx, k).Val() }; slot(c.Key("x")) != slot(c.FenceKey("x")) {
			t.Fatalf("prefix %q: %s and %s in different slots", prefix, c.Key("x"), c.FenceKey("x"))
		}
	}
}
