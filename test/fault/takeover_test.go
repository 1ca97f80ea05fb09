package fault

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/internal/testkit"
)

// backlog inserts n events round-robin over aggs aggregates (deal/0..) in one
// transaction and records them as committed.
func (c *cluster) backlog(n, aggs int) {
	c.t.Helper()
	ctx := context.Background()
	rows, err := c.st.Pool().Query(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'deal', (g % $2)::text, 'deal.funded', jsonb_build_object('n', g)
		FROM generate_series(0, $1 - 1) g ORDER BY g RETURNING id`, n, aggs)
	if err != nil {
		c.t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		c.t.Fatal(err)
	}
	c.prodMu.Lock()
	c.committed = append(c.committed, ids...)
	c.prodMu.Unlock()
}

// flowAfter waits until every one of aggs aggregates has had a delivery from
// a leader newer than dead since killAt, and until no row is pending; it
// returns both times, measured from killAt.
func (c *cluster) flowAfter(killAt time.Time, dead int64, aggs int, timeout time.Duration) (flowing, drained time.Duration) {
	c.t.Helper()
	deadline := killAt.Add(timeout)
	for flowing == 0 || drained == 0 {
		if time.Now().After(deadline) {
			c.t.Fatalf("after %s: every aggregate flowing after %s, backlog drained after %s (0 = not yet)", timeout, flowing, drained)
		}
		if flowing == 0 {
			first := map[string]time.Time{}
			for _, h := range c.rc.Requests() {
				if h.Token > dead && h.OK() && h.At.After(killAt) {
					if _, ok := first[h.Agg]; !ok {
						first[h.Agg] = h.At
					}
				}
			}
			if len(first) == aggs {
				for _, at := range first {
					flowing = max(flowing, at.Sub(killAt))
				}
			}
		}
		if drained == 0 {
			var pending int
			if err := c.st.Pool().QueryRow(context.Background(),
				`SELECT count(*) FROM outbox WHERE dispatched_at IS NULL AND dead_at IS NULL`).Scan(&pending); err != nil {
				c.t.Fatal(err)
			}
			if pending == 0 {
				drained = time.Since(killAt)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return flowing, drained
}

// kill -9 of the leader in the middle of a batch, under a backlog of 3,000
// events over 50 aggregates, with the default batch (500) and claim TTL
// (60 s): the standby takes over the dead leader's claims at once, so every
// aggregate flows again, and the backlog is drained, within about one lock
// TTL of the kill, not claim_ttl. The assertion tells the two mechanisms
// apart (half of claim_ttl), not how fast this machine is: the time itself
// is a benchmark figure (OUTBOXD_TEST_FAULT_REPORT writes it for
// BENCHMARKS.md), and a threshold near the TTL fails on a loaded machine.
// Per backend, one after the other. Not parallel: it times what a user
// sees, so it runs before this package's parallel cases, not among them.
func TestKillLeaderTimeToFlow(t *testing.T) {
	eachBackend(t, true, testKillLeaderTimeToFlow)
}

func testKillLeaderTimeToFlow(t *testing.T, b backend) {
	const (
		ttl      = 3 * time.Second
		events   = 3000
		aggs     = 50
		claimTTL = 60 * time.Second
		maxDelay = claimTTL / 2 // waiting out the claims takes claimTTL
	)
	c := newCluster(t, options{plain: true, batch: 500, backend: b, named: true, env: []string{
		"OUTBOXD_POLLER_LOCK_TTL=" + ttl.String(), "OUTBOXD_POLLER_CLAIM_TTL=" + claimTTL.String(),
		"OUTBOXD_POLLER_CONCURRENCY=16", "OUTBOXD_DISPATCH_WEBHOOK_TIMEOUT=1s",
	}})
	c.backlog(events, aggs)
	// Every send is held: the leader's first batch stays in flight, and no
	// aggregate's events are delivered before the kill, so every aggregate
	// must flow again under its successor.
	release := c.rc.Hold(func(testkit.Request) bool { return true })
	c.startAll(3)
	c.waitHeld()
	l := c.leader()
	var dead int64
	if err := c.st.Pool().QueryRow(context.Background(), `SELECT token FROM outbox_fence WHERE lock_name = 'lock:outbox:poller'`).Scan(&dead); err != nil {
		t.Fatalf("read the leader's fence: %v", err)
	}
	killAt := time.Now()
	c.signal(l, syscall.SIGKILL)
	<-c.reps[l].Done()
	release() // its held send now "succeeds" at the receiver: the successor must resend

	flowing, drained := c.flowAfter(killAt, dead, aggs, 90*time.Second)
	c.stopAll()
	rep := c.check(killAt, nil)
	t.Logf("%s: kill -9 of the leader (lock TTL %s, %d events over %d aggregates, batch 500, claim TTL 60s): "+
		"every aggregate flowing again after %s, backlog drained after %s", b.name, ttl, events, aggs,
		flowing.Round(time.Millisecond), drained.Round(time.Millisecond))
	if rep.duplicates == 0 {
		t.Error("no duplicate: the kill did not hit a batch between send and mark")
	}
	if flowing > maxDelay || drained > maxDelay {
		t.Errorf("time to flow %s, to drain %s; want both within half of claim_ttl (%s): the claims were waited out",
			flowing.Round(time.Millisecond), drained.Round(time.Millisecond), maxDelay)
	}
	if f := os.Getenv("OUTBOXD_TEST_FAULT_REPORT"); f != "" { // for BENCHMARKS.md
		appendReport(f, fmt.Sprintf("kill9_time_to_flow_ms %d drained_ms %d backend %s\n", flowing.Milliseconds(), drained.Milliseconds(), b.name))
	}
}
