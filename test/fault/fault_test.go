package fault

import (
	"context"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// runCase starts three replicas and the producer, lets events flow, injects
// the fault, keeps producing, then drains, stops everything and checks.
func runCase(t *testing.T, inject func(c *cluster), deadAggs map[string]bool) report {
	return runCaseWith(t, options{}, inject, deadAggs)
}

func runCaseWith(t *testing.T, opt options, inject func(c *cluster), deadAggs map[string]bool) report {
	c := newCluster(t, opt)
	c.startAll(3)
	c.leader()
	c.produce()
	time.Sleep(1500 * time.Millisecond)
	faultAt := time.Now()
	inject(c)
	time.Sleep(1500 * time.Millisecond)
	c.stopProducing()
	c.drain(60 * time.Second)
	time.Sleep(200 * time.Millisecond) // the last batch's marks
	c.stopAll()
	return c.check(faultAt, deadAggs)
}

func TestKillLeaderMidBatch(t *testing.T) {
	rep := runCase(t, func(c *cluster) {
		l := c.leader()
		release := c.rc.hold("deal/3") // a batch is in flight when the leader dies
		c.waitHeld()
		c.signal(l, syscall.SIGKILL)
		<-c.reps[l].done
		release() // its held send now "succeeds" at the receiver: the successor must resend
	}, nil)
	if rep.tokens < 2 {
		t.Fatal("no takeover after the leader was killed")
	}
	if rep.duplicates == 0 {
		t.Fatal("no duplicate: the kill did not hit a batch between send and mark")
	}
}

func TestPausedLeaderResumes(t *testing.T) {
	rep := runCase(t, func(c *cluster) {
		l := c.leader()
		release := c.rc.hold("deal/3")
		c.waitHeld()
		c.signal(l, syscall.SIGSTOP)
		release()
		time.Sleep(2 * lockTTL)
		if n := c.leader(); n == l {
			t.Fatal("the paused leader still reported leading")
		}
		c.signal(l, syscall.SIGCONT)
		time.Sleep(500 * time.Millisecond) // it resumes, finds its lease gone, tries to write
	}, nil)
	// Whether the resumed leader still has results to write depends on which
	// of its sends Go's transport completes or abandons after SIGCONT; when it
	// writes, the fence refuses it (counted here). The deterministic proof is
	// poller.TestPausedLeaderIsFencedOut; this case checks the invariants.
	t.Logf("fence rejections after resume: %d", rep.fenceRejected)
}

func TestRedisFlushAll(t *testing.T) {
	runCase(t, func(c *cluster) {
		rdb := c.redis.Client()
		if err := rdb.FlushAll(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
	}, nil)
}

func TestRedisRestart(t *testing.T) {
	runCase(t, func(c *cluster) { c.redis.Restart() }, nil)
}

func TestReceiverOutage(t *testing.T) {
	runCase(t, func(c *cluster) {
		c.rc.setStatus(func(string) int { return http.StatusServiceUnavailable })
		time.Sleep(outage())
		c.rc.setStatus(nil)
	}, nil)
}

func TestReceiverRejectsOneAggregate(t *testing.T) {
	const bad = "deal/7"
	rep := runCase(t, func(c *cluster) {
		c.rc.setStatus(func(agg string) int {
			if agg == bad {
				return http.StatusBadRequest
			}
			return http.StatusNoContent
		})
	}, map[string]bool{bad: true})
	if rep.dead == 0 {
		t.Fatal("the rejected aggregate's events were not dead-lettered")
	}
}

func TestRollingRestart(t *testing.T) {
	runCase(t, func(c *cluster) {
		for i := range c.reps {
			c.signal(i, syscall.SIGTERM)
			select {
			case <-c.reps[i].done:
			case <-time.After(15 * time.Second):
				t.Fatalf("replica %d did not stop on SIGTERM", i)
			}
			if err := c.reps[i].waitErr; err != nil {
				t.Fatalf("replica %d exited with %v on SIGTERM", i, err)
			}
			c.start(i)
			time.Sleep(500 * time.Millisecond)
		}
	}, nil)
}

func TestAllKilledAndRestarted(t *testing.T) {
	runCase(t, func(c *cluster) {
		for i := range c.reps {
			c.signal(i, syscall.SIGKILL)
		}
		for _, r := range c.reps {
			<-r.done
		}
		time.Sleep(lockTTL)
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
	runCaseWith(t, options{proxies: true}, func(c *cluster) {
		remove := c.toxic(c.pgProxy, "reset", "reset_peer", "downstream", `{"timeout":0}`)
		time.Sleep(500 * time.Millisecond)
		remove()
		time.Sleep(500 * time.Millisecond)
		remove = c.toxic(c.pgProxy, "blackhole", "timeout", "upstream", `{"timeout":0}`)
		time.Sleep(outage())
		remove()
	}, nil)
}

func TestPostgresCrashRestart(t *testing.T) {
	runCaseWith(t, options{ownPostgres: true}, func(c *cluster) { c.pg.CrashRestart() }, nil)
}

func TestRedisLatencyMakesLeaderStepDown(t *testing.T) {
	rep := runCaseWith(t, options{proxies: true}, func(c *cluster) {
		l := c.leader()
		// Replies slower than the lease: renewals cannot land in time.
		remove := c.toxic(c.redisPx[l], "slow", "latency", "downstream", `{"latency":1500,"jitter":0}`)
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(c.reps[l].logs(), `"msg":"lock lost"`) {
			if time.Now().After(deadline) {
				t.Fatal("the slowed leader never gave up its lock")
			}
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(2 * lockTTL)
		remove()
	}, nil)
	if rep.tokens < 2 {
		t.Fatal("no other replica took over from the slowed leader")
	}
}
