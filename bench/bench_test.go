// Package bench measures outboxd side by side with peers on the same
// Postgres and Redis, in one run. Its own module keeps the peers out of the
// daemon's go.mod.
//
//	cd bench && go test -run '^$' -bench . -benchtime 1x -count 3   # drains
//	cd bench && go test -run '^$' -bench 'Lock' -count 5            # locks
package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/outboxd/outboxd/bench/benchenv"
	"github.com/outboxd/outboxd/bench/peer"
	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/internal/metrics"
	"github.com/outboxd/outboxd/lock"
	"github.com/outboxd/outboxd/lock/redislease"
	"github.com/outboxd/outboxd/migrations"
	"github.com/outboxd/outboxd/poller"
	"github.com/outboxd/outboxd/store"
)

const backlog = 100000

var (
	baseDSN   = benchenv.PostgresDSN()
	redisAddr = benchenv.RedisAddr()
)

// freshDB creates a database and returns its DSN; dropped at cleanup.
func freshDB(b *testing.B) string {
	dsn, drop, err := benchenv.FreshDB(context.Background(), baseDSN)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(drop)
	return dsn
}

// ---- backlog drain: outboxd vs the watermill-sql forwarder ----

func BenchmarkDrain(b *testing.B) {
	for _, batch := range []int{100, 1000} {
		b.Run("outboxd/batch="+strconv.Itoa(batch), func(b *testing.B) {
			for range b.N {
				b.ReportMetric(drainOutboxd(b, batch), "events/s")
			}
		})
		b.Run("watermill-forwarder/batch="+strconv.Itoa(batch), func(b *testing.B) {
			for range b.N {
				b.ReportMetric(drainWatermill(b, batch), "events/s")
			}
		})
	}
}

func drainOutboxd(b *testing.B, batch int) float64 {
	ctx := context.Background()
	dsn := freshDB(b)
	if _, err := migrations.Up(ctx, dsn, nil); err != nil {
		b.Fatal(err)
	}
	st, err := store.Open(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Pool().Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'deal', (i % 1000)::text, 'deal.funded', jsonb_build_object('seq', i)
		FROM generate_series(1, $1) i`, backlog); err != nil {
		b.Fatal(err)
	}
	_, _ = st.Pool().Exec(ctx, `VACUUM ANALYZE outbox`)
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, PoolSize: 64})
	defer rdb.Close()
	prefix := fmt.Sprintf("cmp:%d:", time.Now().UnixNano())
	locks := redislease.New([]redis.UniversalClient{rdb}, redislease.WithKeyPrefix(prefix))
	p := poller.New(poller.Config{BatchSize: batch, KeyPrefix: prefix}, poller.Deps{Store: st, Locks: locks,
		Redis: rdb, Sink: dispatch.Noop{}, Log: slog.New(slog.NewJSONHandler(io.Discard, nil)), Metrics: metrics.New()})
	b.ResetTimer()
	start := time.Now()
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = p.Run(rctx) })
	for {
		var left bool
		if err := st.Pool().QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM outbox WHERE dispatched_at IS NULL)`).Scan(&left); err != nil {
			b.Fatal(err)
		}
		if !left {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	cancel()
	wg.Wait()
	benchenv.CleanKeys(rdb, prefix)
	return backlog / elapsed.Seconds()
}

func drainWatermill(b *testing.B, batch int) float64 {
	elapsed, err := peer.WatermillDrain(context.Background(), freshDB(b), batch, backlog, 12, true)
	if err != nil {
		b.Fatal(err)
	}
	return backlog / elapsed.Seconds()
}

// ---- locks: outboxd/lock vs bsm/redislock vs go-redsync ----

// lockImpl acquires (waiting) and returns a release func.
type lockImpl func(ctx context.Context, key string) (func(), error)

func impls(b *testing.B, rdb *redis.Client) map[string]lockImpl {
	ours := redislease.New([]redis.UniversalClient{rdb})
	bsm := redislock.New(rdb)
	rs := redsync.New(goredis.NewPool(rdb))
	ttl := 30 * time.Second
	return map[string]lockImpl{
		"outboxd": func(ctx context.Context, key string) (func(), error) {
			l, err := ours.Acquire(ctx, key, lock.Options{TTL: ttl, Wait: 10 * time.Second})
			if err != nil {
				return nil, err
			}
			return func() { _ = l.Release(ctx) }, nil
		},
		"bsm-redislock": func(ctx context.Context, key string) (func(), error) {
			l, err := bsm.Obtain(ctx, key, ttl, &redislock.Options{
				RetryStrategy: redislock.LimitRetry(redislock.LinearBackoff(50*time.Millisecond), 200)})
			if err != nil {
				return nil, err
			}
			return func() { _ = l.Release(ctx) }, nil
		},
		"go-redsync": func(ctx context.Context, key string) (func(), error) {
			m := rs.NewMutex(key, redsync.WithExpiry(ttl), redsync.WithTries(200), redsync.WithRetryDelay(50*time.Millisecond))
			if err := m.LockContext(ctx); err != nil {
				return nil, err
			}
			return func() { _, _ = m.UnlockContext(ctx) }, nil
		},
	}
}

// BenchmarkLockAcquireRelease: uncontended acquire + release round trip.
func BenchmarkLockAcquireRelease(b *testing.B) {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	for _, name := range []string{"outboxd", "bsm-redislock", "go-redsync"} {
		impl := impls(b, rdb)[name]
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			key := fmt.Sprintf("bench:lock:%s:%d", name, time.Now().UnixNano())
			for range b.N {
				release, err := impl(ctx, key)
				if err != nil {
					b.Fatal(err)
				}
				release()
			}
		})
	}
}

// BenchmarkLockHandover: a holder releases while a waiter waits; reported
// is the time from the release call to the waiter holding the lock.
func BenchmarkLockHandover(b *testing.B) {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	for _, name := range []string{"outboxd", "bsm-redislock", "go-redsync"} {
		impl := impls(b, rdb)[name]
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			key := fmt.Sprintf("bench:handover:%s:%d", name, time.Now().UnixNano())
			var total time.Duration
			for range b.N {
				release, err := impl(ctx, key)
				if err != nil {
					b.Fatal(err)
				}
				got := make(chan time.Time, 1)
				go func() {
					r2, err := impl(ctx, key)
					if err != nil {
						panic(err)
					}
					got <- time.Now()
					r2()
				}()
				time.Sleep(120 * time.Millisecond) // the waiter has tried and is waiting
				at := time.Now()
				release()
				total += (<-got).Sub(at)
			}
			b.ReportMetric(float64(total.Microseconds())/float64(b.N)/1000, "ms/handover")
		})
	}
}
