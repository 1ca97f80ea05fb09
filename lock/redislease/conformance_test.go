package redislease_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/lock"
	"github.com/outboxd/outboxd/lock/leasetest"
	"github.com/outboxd/outboxd/lock/redislease"
)

// subject is the Redis lease over nodes, under a prefix of the test's own.
func subject(t *testing.T, nodes []*redis.Client) leasetest.Subject {
	prefix := testenv.Prefix(t)
	all := make([]redis.UniversalClient, len(nodes))
	for i, n := range nodes {
		all[i] = n
		t.Cleanup(func() { dropPrefix(n, prefix) })
	}
	c := redislease.New(all, redislease.WithKeyPrefix(prefix))
	each := func(ctx context.Context, f func(n *redis.Client) error) error {
		for _, n := range nodes {
			if err := f(n); err != nil {
				return err
			}
		}
		return nil
	}
	return leasetest.Subject{
		Replica: func() lock.Lease { return redislease.New(all, redislease.WithKeyPrefix(prefix)) },
		Remove: func(ctx context.Context, name string) error {
			return each(ctx, func(n *redis.Client) error { return n.Del(ctx, c.Key(name)).Err() })
		},
		Steal: func(ctx context.Context, name string) error {
			return each(ctx, func(n *redis.Client) error { return n.Set(ctx, c.Key(name), "thief", leasetestTTL).Err() })
		},
		Waiting: func(ctx context.Context, name string) bool {
			channel := c.Key(name) + ":released"
			n, err := nodes[0].PubSubNumSub(ctx, channel).Result()
			return err == nil && n[channel] >= int64(len(nodes))
		},
	}
}

// leasetestTTL is a stolen lease's TTL: longer than any case runs.
const leasetestTTL = 10 * time.Minute

func dropPrefix(n *redis.Client, prefix string) {
	ctx := context.Background()
	iter := n.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if len(keys) > 0 {
		n.Del(ctx, keys...)
	}
}

// The Redis lease on one node passes the lease conformance suite.
func TestConformanceSingle(t *testing.T) {
	t.Parallel()
	leasetest.Run(t, func(t *testing.T) leasetest.Subject {
		rdb, _ := testenv.Redis(t)
		return subject(t, []*redis.Client{rdb})
	})
}

// The Redis lease in Redlock mode, over three databases of the test Redis
// as its nodes, passes the lease conformance suite. Release channels are
// server-wide, so a waiter hears each release once per node.
func TestConformanceRedlock(t *testing.T) {
	t.Parallel()
	leasetest.Run(t, func(t *testing.T) leasetest.Subject {
		var nodes []*redis.Client
		for db := 1; db <= 3; db++ {
			n := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(), DB: db, ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = n.Close() })
			nodes = append(nodes, n)
		}
		return subject(t, nodes)
	})
}
