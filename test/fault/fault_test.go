package fault

import (
	"context"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testkit"
)

// runCase starts three replicas and the producer, lets events flow, injects
// the fault, keeps producing, then drains, stops everything and checks.
func runCase(t *testing.T, inject func(c *cluster), deadAggs map[string]bool) report {
	return runCaseWith(t, options{}, inject, deadAggs)
}

func runCaseWith(t *testing.T, opt options, inject func(c *cluster), deadAggs map[string]bool) report {
	_, rep := runCluster(t, opt, (*cluster).produce, inject, deadAggs)
	return rep
}

// runCluster is runCaseWith with the producer of the case's choice; it
// returns the stopped cluster for checks of the case's own.
func runCluster(t *testing.T, opt options, produce, inject func(c *cluster), deadAggs map[string]bool) (*cluster, report) {
	c := newCluster(t, opt)
	c.startAll(3)
	c.leader()
	started := time.Now()
	produce(c)
	c.waitFlowing(started, flowing, 30*time.Second)
	faultAt := time.Now()
	inject(c)
	// Producing on until the cluster relays again: rows written during
	// the recovery are part of what is checked.
	c.waitFlowing(time.Now(), flowing, 60*time.Second)
	c.stopProducing()
	c.drain(60 * time.Second)
	c.stopAll() // each replica finishes its batch (marks written) before it exits
	return c, c.check(faultAt, deadAggs)
}

// flowing is how many deliveries say the cluster relays: two batches.
const flowing = 2 * batchSize

func TestRedisFlushAll(t *testing.T) {
	t.Parallel()
	runCase(t, func(c *cluster) {
		rdb := c.redis.Client()
		if err := rdb.FlushAll(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
	}, nil)
}

func TestReceiverOutage(t *testing.T) {
	t.Parallel()
	runCase(t, func(c *cluster) {
		c.rc.SetRespond(func(testkit.Request) testkit.Reply { return testkit.Reply{Status: http.StatusServiceUnavailable} })
		time.Sleep(outage()) // the outage's length
		c.rc.SetRespond(nil)
	}, nil)
}

func TestReceiverRejectsOneAggregate(t *testing.T) {
	t.Parallel()
	const bad = "deal/7"
	rep := runCase(t, func(c *cluster) {
		c.rc.SetRespond(testkit.Statuses(map[string]int{bad: http.StatusBadRequest}))
	}, map[string]bool{bad: true})
	if rep.dead == 0 {
		t.Fatal("the rejected aggregate's events were not dead-lettered")
	}
}

func TestRollingRestart(t *testing.T) {
	t.Parallel()
	runCase(t, func(c *cluster) {
		for i := range c.reps {
			c.signal(i, syscall.SIGTERM)
			select {
			case <-c.reps[i].Done():
			case <-time.After(15 * time.Second):
				t.Fatalf("replica %d did not stop on SIGTERM", i)
			}
			if err := c.reps[i].Err(); err != nil {
				t.Fatalf("replica %d exited with %v on SIGTERM", i, err)
			}
			c.start(i)
			c.waitReady(i) // up again before the next one stops
		}
	}, nil)
}

func TestAllKilledAndRestarted(t *testing.T) {
	t.Parallel()
	runCase(t, func(c *cluster) {
		for i := range c.reps {
			c.signal(i, syscall.SIGKILL)
		}
		for _, r := range c.reps {
			<-r.Done()
		}
		// Restarted once the dead leader's lease has expired.
		rdb := c.redis.Client()
		testkit.WaitFor(t, 5*lockTTL, "the dead leader's lease to expire", func() bool {
			return rdb.Exists(context.Background(), "lock:outbox:poller").Val() == 0
		}, nil)
		for i := range c.reps {
			c.start(i)
		}
	}, nil)
}

func outage() time.Duration {
	if testing.Short() {
		return 3 * time.Second
	}
	return 10 * time.Second
}

func TestPostgresResetsAndBlackhole(t *testing.T) {
	t.Parallel()
	runCaseWith(t, options{proxies: true}, func(c *cluster) {
		// The sleeps are the faults' lengths and the gap between them.
		remove := c.toxic(c.pgProxy, "reset", "reset_peer", "downstream", `{"timeout":0}`)
		time.Sleep(500 * time.Millisecond)
		remove()
		time.Sleep(500 * time.Millisecond)
		remove = c.toxic(c.pgProxy, "blackhole", "timeout", "upstream", `{"timeout":0}`)
		time.Sleep(outage())
		remove()
	}, nil)
}

func TestRedisLatencyMakesLeaderStepDown(t *testing.T) {
	t.Parallel()
	rep := runCaseWith(t, options{proxies: true}, func(c *cluster) {
		l := c.leader()
		// Replies slower than the lease: renewals cannot land in time.
		remove := c.toxic(c.redisPx[l], "slow", "latency", "downstream", `{"latency":1500,"jitter":0}`)
		if _, ok := c.reps[l].out.Await(10*time.Second, 1, func(line string) bool {
			return strings.Contains(line, `"msg":"lock lost"`)
		}); !ok {
			t.Fatal("the slowed leader never gave up its lock")
		}
		c.leaderOtherThan(l) // slow until another replica has taken over
		remove()
	}, nil)
	if rep.tokens < 2 {
		t.Fatal("no other replica took over from the slowed leader")
	}
}
