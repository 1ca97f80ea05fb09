package blackbox

import (
	"context"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/internal/testkit"
)

// With lock.backend: postgres and the default idempotency.store (postgres),
// outboxd needs no Redis: with redis.addrs at a closed port, at a port that
// counts the connections made to it, or empty, replicas deliver, hand over
// on SIGTERM, recover from a kill -9 of the leader, and an event the
// killed leader delivered is not delivered again by the next one (its
// delivered mark in outbox_idempotency says so), while a row that took its
// id with another payload is sent. The CLI's status runs without Redis too,
// and nothing ever connects to the Redis address.
func TestPostgresOnlyDeploymentNeedsNoRedis(t *testing.T) {
	for _, tc := range []struct {
		name  string
		redis func(t *testing.T) (addr string, conns *atomic.Int64)
	}{
		{"redis.addrs at a closed port", func(t *testing.T) (string, *atomic.Int64) { return freeAddr(t), nil }},
		{"redis.addrs at a port that counts connections", countingPort},
		{"no redis.addrs", func(*testing.T) (string, *atomic.Int64) { return "", nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			addr, conns := tc.redis(t)
			e := setup(t).set("OUTBOXD_LOCK_BACKEND", "postgres", "OUTBOXD_REDIS_ADDRS", addr)
			rc := newRecorder(t, nil)
			e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", rc.URL())
			runPostgresOnly(t, e, rc)
			if conns != nil && conns.Load() != 0 {
				t.Errorf("%d connection(s) were made to redis.addrs %s, want none", conns.Load(), addr)
			}
		})
	}
}

// runPostgresOnly delivers, hands over, survives a kill -9 and checks the
// delivered marks, on e's replicas.
func runPostgresOnly(t *testing.T, e *testBundle, rc *testkit.Receiver) {
	a := e.start()
	b := e.set("OUTBOXD_HTTP_ADDR", freeAddr(t)).start()
	first := e.insertMany("first", 4, 5)
	waitDelivered(e, first)
	leader, standby := leaderOf(t, a, b)

	leader.stop() // SIGTERM: a handover
	if len(leader.logsMatching(logged("lock released"))) == 0 {
		t.Fatalf("the leader did not release its lease on SIGTERM:\n%s", leader.tail(20))
	}
	second := e.insertMany("second", 4, 5)
	waitDelivered(e, second)
	if !standby.awaitLog(waitTimeout, pollerAcquired) {
		t.Fatalf("the standby did not take the lease:\n%s", standby.tail(20))
	}

	c := e.set("OUTBOXD_HTTP_ADDR", freeAddr(t)).start()
	standby.kill() // kill -9 of the leader: nothing released
	third := e.insertMany("third", 4, 5)
	waitDelivered(e, third)
	if !c.awaitLog(waitTimeout, pollerAcquired) {
		t.Fatalf("no replica took over after the leader was killed:\n%s", c.tail(20))
	}
	if code := runBinary(t, e.vars, 30*time.Second, "status"); code.code != 0 {
		t.Fatalf("outboxd status without Redis: %s", code)
	} else if !strings.Contains(code.stdout, "TOKEN ISSUED (postgres)") {
		t.Errorf("outboxd status does not name postgres as the issuer of tokens:\n%s", code.stdout)
	}
	if started := a.logsMatching(logged("outboxd started")); len(started) != 1 || !strings.Contains(started[0], `"redis_mode":"none"`) {
		t.Errorf("a replica without Redis logged %q, want one \"outboxd started\" with redis_mode none", started)
	}

	// The killed leader delivered second[0]; its row reads pending again
	// (as after a write the fence refused). second[1] is written again with
	// another payload: its mark names the row it replaced.
	c.stop()
	again, changed := second[0], second[1]
	execRow(t, e, `UPDATE outbox SET dispatched_at = NULL WHERE id = @id`, again)
	execRow(t, e, `UPDATE outbox SET dispatched_at = NULL, payload = '{"changed": true}' WHERE id = @id`, changed)
	d := e.set("OUTBOXD_HTTP_ADDR", freeAddr(t)).start()
	waitDelivered(e, []int64{again, changed})
	if n := d.metric(t, "outboxd_already_delivered_total"); n != 1 {
		t.Errorf("outboxd_already_delivered_total = %v, want 1 (the row the killed leader delivered)", n)
	}
	seen := map[int64]int{}
	for _, r := range rc.Requests() {
		if r.OK() {
			seen[r.ID]++
		}
	}
	all := append(append(first, second...), third...)
	if seen[changed] != 2 {
		t.Errorf("row %d written again with another payload was received %d times, want 2", changed, seen[changed])
	}
	seen[changed] = 1
	if dups := consumedOnce(t, all, seen, "the receiver"); dups > 0 {
		t.Errorf("%d event(s) received more than once across a handover and a kill -9 (row %d: %d)", dups, again, seen[again])
	}
}

// countingPort listens on a free port, counts each connection and closes
// it at once: a Redis no client can use, which tells whether one tried.
func countingPort(t *testing.T) (string, *atomic.Int64) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			_ = c.Close()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	return ln.Addr().String(), &n
}

// leaderOf is the replica of a and b that took lock:outbox:poller, and the other.
func leaderOf(t *testing.T, a, b *replica) (leader, standby *replica) {
	t.Helper()
	waitFor(t, "a leader", func() bool {
		return len(a.logsMatching(pollerAcquired)) > 0 || len(b.logsMatching(pollerAcquired)) > 0
	}, func() string { return a.tail(10) + "\n" + b.tail(10) })
	if len(a.logsMatching(pollerAcquired)) > 0 {
		return a, b
	}
	return b, a
}

func pollerAcquired(_ string, rec map[string]any) bool {
	return rec["msg"] == "lock acquired" && rec["lock"] == "lock:outbox:poller"
}

func logged(msg string) func(string, map[string]any) bool {
	return func(_ string, rec map[string]any) bool { return rec["msg"] == msg }
}

// waitDelivered waits until every row of ids is marked delivered.
func waitDelivered(e *testBundle, ids []int64) {
	e.t.Helper()
	waitFor(e.t, strconv.Itoa(len(ids))+" rows delivered", func() bool {
		return e.count("id = ANY($1) AND dispatched_at IS NOT NULL", ids) == len(ids)
	}, e.describeRows("id = ANY($1)", ids))
}

func execRow(t *testing.T, e *testBundle, sql string, id int64) {
	t.Helper()
	if _, err := e.pool.Exec(context.Background(), sql, pgx.NamedArgs{"id": id}); err != nil {
		t.Fatal(err)
	}
}
