package redislease_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/lock"
	"github.com/outboxd/outboxd/lock/redislease"
)

const (
	hammerEnv       = "OUTBOXD_TEST_LOCK_HAMMER"
	hammerProcs     = 3
	hammerGoroutine = 20
	hammerFor       = 10 * time.Second
)

// hammerChild runs the contender side when the test binary is re-executed by
// TestMutualExclusionAcrossProcesses; it reports whether it did.
func hammerChild() bool {
	spec := os.Getenv(hammerEnv)
	if spec == "" {
		return false
	}
	addr, prefix := os.Getenv("H_ADDR"), os.Getenv("H_PREFIX")
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, PoolSize: 64})
	defer rdb.Close()
	c := redislease.New([]redis.UniversalClient{rdb}, redislease.WithKeyPrefix(prefix))
	ctx := context.Background()
	deadline := time.Now().Add(hammerFor)
	var wg sync.WaitGroup
	for range hammerGoroutine {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				l, err := c.Acquire(ctx, "lock:hammer", lock.Options{TTL: 5 * time.Second, Wait: time.Second})
				if err != nil {
					if !errors.Is(err, lock.ErrNotObtained) {
						rdb.Incr(ctx, prefix+"errors")
					}
					continue
				}
				// Critical section: nobody else may be inside.
				if n := rdb.Incr(ctx, prefix+"inside").Val(); n != 1 {
					rdb.Incr(ctx, prefix+"violations")
				}
				time.Sleep(time.Millisecond)
				rdb.Decr(ctx, prefix+"inside")
				if l.Context().Err() != nil {
					rdb.Incr(ctx, prefix+"lost")
				}
				rdb.Incr(ctx, prefix+"entries")
				if err := l.Release(ctx); err != nil {
					rdb.Incr(ctx, prefix+"release_errors")
				}
			}
		})
	}
	wg.Wait()
	os.Exit(0)
	return true
}

// Not parallel: three processes of twenty goroutines keep both cores busy
// for 10 s, which would starve the 1 s leases of the other tests.
func TestMutualExclusionAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("10 s multi-process contention test; runs without -short")
	}
	rdb, prefix := testenv.Redis(t)
	ctx := context.Background()
	var cmds []*exec.Cmd
	for range hammerProcs {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), hammerEnv+"=1", "H_ADDR="+testenv.RedisAddr(), "H_PREFIX="+prefix)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("contender process %d: %v", i, err)
		}
	}
	get := func(k string) int64 {
		v, err := rdb.Get(ctx, prefix+k).Int64()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		return v
	}
	entries := get("entries")
	t.Logf("%d critical sections by %d processes x %d goroutines in %s", entries, hammerProcs, hammerGoroutine, hammerFor)
	if v := get("violations"); v != 0 {
		t.Fatalf("%d overlapping critical sections", v)
	}
	for _, k := range []string{"errors", "lost", "release_errors"} {
		if v := get(k); v != 0 {
			t.Errorf("%s: %d", k, v)
		}
	}
	// 1 ms sections for 10 s: a working lock hands over hundreds of times at least.
	if entries < 100 {
		t.Fatalf("only %d critical sections: contention starved the lock", entries)
	}
}

func redlockNodes(t *testing.T, n int) ([]*testenv.RedisServer, []redis.UniversalClient) {
	var srvs []*testenv.RedisServer
	var clients []redis.UniversalClient
	for range n {
		s := testenv.StartRedisServer(t)
		srvs = append(srvs, s)
		clients = append(clients, s.Client())
	}
	return srvs, clients
}

func TestRedlockToleratesMinorityDown(t *testing.T) {
	t.Parallel()
	for _, n := range []int{3, 5} {
		t.Run(strconv.Itoa(n)+"nodes", func(t *testing.T) {
			t.Parallel()
			srvs, clients := redlockNodes(t, n)
			c := redislease.New(clients)
			ctx := context.Background()
			opts := lock.Options{TTL: 2 * time.Second, Wait: 500 * time.Millisecond}

			a, err := c.Acquire(ctx, "lock:rl", opts)
			if err != nil {
				t.Fatalf("all up: %v", err)
			}
			if _, err := c.TryAcquire(ctx, "lock:rl", opts); !errors.Is(err, lock.ErrNotObtained) {
				t.Fatalf("second holder with all up: %v", err)
			}
			release(t, a)

			minority := (n - 1) / 2
			for _, s := range srvs[:minority] {
				s.Stop()
			}
			b, err := c.Acquire(ctx, "lock:rl", opts)
			if err != nil {
				t.Fatalf("%d of %d down: %v", minority, n, err)
			}
			if b.Token() <= a.Token() {
				t.Fatalf("token %d after %d", b.Token(), a.Token())
			}
			if err := b.Extend(ctx); err != nil {
				t.Fatalf("extend with a minority down: %v", err)
			}
			release(t, b)

			srvs[minority].Stop() // now a majority is down
			_, err = c.Acquire(ctx, "lock:rl", opts)
			if !errors.Is(err, lock.ErrNotObtained) {
				t.Fatalf("majority down: got %v, want ErrNotObtained", err)
			}
		})
	}
}

func TestRedlockTokensIncreaseAcrossShiftingMajorities(t *testing.T) {
	t.Parallel()
	srvs, clients := redlockNodes(t, 3)
	c := redislease.New(clients)
	ctx := context.Background()
	opts := lock.Options{TTL: 2 * time.Second, Wait: 500 * time.Millisecond, RenewInterval: -1}
	// Skew one counter: node 2 has issued many more tokens than the others.
	if err := clients[2].Set(ctx, c.FenceKey("lock:m"), 50, 0).Err(); err != nil {
		t.Fatal(err)
	}

	srvs[1].Stop() // majority {0, 2}
	a, err := c.Acquire(ctx, "lock:m", opts)
	if err != nil {
		t.Fatal(err)
	}
	release(t, a)
	srvs[1].Start()
	srvs[2].Stop() // majority {0, 1}: node 1 restarted empty, node 2 (the high one) gone
	b, err := c.Acquire(ctx, "lock:m", opts)
	if err != nil {
		t.Fatal(err)
	}
	release(t, b)
	if a.Token() < 51 || b.Token() <= a.Token() {
		t.Fatalf("tokens %d then %d: a later majority must issue a larger token", a.Token(), b.Token())
	}
	t.Logf("redlock tokens across majorities: %d then %d", a.Token(), b.Token())
}
