package lock_test

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/lock"
)

// A three-master Redis Cluster: the lock key and its fence counter share a
// hash slot whatever the prefix, so the scripts run there.
func TestRedisCluster(t *testing.T) {
	var addrs []string
	for range 3 {
		s := testenv.StartRedisServerArgs(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000")
		addrs = append(addrs, s.Addr)
	}
	out, err := exec.Command("redis-cli", append(append([]string{"--cluster", "create"}, addrs...),
		"--cluster-replicas", "0", "--cluster-yes")...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	defer rdb.Close()
	ctx := context.Background()
	deadline := time.Now().Add(20 * time.Second)
	for {
		info, err := rdb.ClusterInfo(ctx).Result()
		if err == nil && strings.Contains(info, "cluster_state:ok") && rdb.Ping(ctx).Err() == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster not ready: %v %s", err, info)
		}
		time.Sleep(100 * time.Millisecond)
	}

	for _, prefix := range []string{"", "billing:", "{tenant}:"} {
		c := lock.New([]redis.UniversalClient{rdb}, lock.WithKeyPrefix(prefix))
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
		if slot := func(k string) int64 { return rdb.ClusterKeySlot(ctx, k).Val() }; slot(c.Key("x")) != slot(c.FenceKey("x")) {
			t.Fatalf("prefix %q: %s and %s in different slots", prefix, c.Key("x"), c.FenceKey("x"))
		}
	}
}
