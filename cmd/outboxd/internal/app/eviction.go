package app

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// evictionCheckTimeout bounds the start's look at each lock node's policy.
const evictionCheckTimeout = 5 * time.Second

// warnEviction logs a WARN for each lock node (each master in cluster mode)
// whose maxmemory-policy is not noeviction: under memory pressure a
// volatile-* policy evicts the keys that have a TTL first (the lock keys,
// the idempotency marks), so the lock changes hands while its holder still
// works, and an allkeys-* policy evicts the fence counters too. A node
// that refuses CONFIG GET (managed Redis) or does not answer is skipped,
// with a DEBUG line: the check never stops the start.
func (a *App) warnEviction(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, evictionCheckTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for _, n := range a.Nodes {
		if c, ok := n.(*redis.ClusterClient); ok {
			_ = c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
				a.checkEvictionPolicy(ctx, m)
				return nil
			})
			continue
		}
		wg.Go(func() { a.checkEvictionPolicy(ctx, n) })
	}
	wg.Wait()
}

// checkEvictionPolicy logs n's maxmemory-policy when it is not noeviction.
func (a *App) checkEvictionPolicy(ctx context.Context, n redis.UniversalClient) {
	addr := nodeAddr(n)
	cfg, err := n.ConfigGet(ctx, "maxmemory*").Result()
	if err != nil {
		a.Log.Debug("redis maxmemory-policy not checked", "redis_addr", addr, "error", err)
		return
	}
	policy, ok := cfg["maxmemory-policy"]
	if !ok || policy == "noeviction" {
		a.Log.Debug("redis maxmemory-policy checked", "redis_addr", addr, "policy", policy)
		return
	}
	a.Log.Warn("redis may evict the lock: maxmemory-policy is not noeviction", "policy", policy,
		"maxmemory", cfg["maxmemory"], "redis_addr", addr,
		"fix", "CONFIG SET maxmemory-policy noeviction on the lock's Redis (and in its redis.conf)")
}

// nodeAddr is the address a client talks to, for the log line.
func nodeAddr(n redis.UniversalClient) string {
	if c, ok := n.(*redis.Client); ok {
		return c.Options().Addr
	}
	return ""
}
