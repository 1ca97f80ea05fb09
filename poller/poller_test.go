package poller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/internal/keys"
	"github.com/outboxd/outboxd/internal/metrics"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/internal/testkit"
	"github.com/outboxd/outboxd/lock/redislease"
	"github.com/outboxd/outboxd/store"
)

// A runner killed at each crash window loses nothing: a successor delivers
// every event. Duplicates appear only where the protocol says they may.
func TestCrashWindowsLoseNothing(t *testing.T) {
	for _, tc := range []struct {
		crash            string
		childSends       bool // the child's first batch reached the receiver
		duplicatesExpect bool
	}{
		{"after-claim", false, false},   // claimed, nothing sent
		{"after-send", true, true},      // sent, keys not yet 1: a successor resends
		{"after-finalize", true, false}, // keys 1, Postgres not marked: marked without resending
	} {
		t.Run(tc.crash, func(t *testing.T) {
			e := setup(t)
			ids := e.insert(200, 20)
			cfg := testConfig()
			// One batch holds every row: the crash then hits exactly the
			// window named, not also a next batch sending beside this one's
			// result write (that would cost duplicates, which the protocol
			// allows, but which this test would count against the window).
			cfg.LockTTL, cfg.BatchSize, cfg.ClaimTTL = time.Second, 200, time.Second
			c := e.startChild(tc.crash, cfg)
			err := c.wait()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("child ended with %v, want killed at %s; logs:\n%s", err, tc.crash, c.logs())
			}
			if n := e.count("dispatched_at IS NOT NULL"); n != 0 {
				t.Fatalf("%d rows marked before the crash, want 0", n)
			}
			sentBefore := len(e.rc.Requests())
			if tc.childSends != (sentBefore > 0) {
				t.Fatalf("child sent %d before dying at %s", sentBefore, tc.crash)
			}
			// The rows the child finalised (their keys hold a delivered
			// mark). A batch is written in pieces as they become ready, and
			// the hook kills at the first piece's finalise: under load the
			// batch's other pieces were sent but not finalised, and resending
			// those is what the protocol allows.
			finalized := map[int64]bool{}
			for _, id := range ids {
				v, err := e.rdb.Get(context.Background(), keys.New(e.prefix).Idempotency(id)).Result()
				if err != nil && !errors.Is(err, redis.Nil) {
					t.Fatal(err)
				}
				if strings.HasPrefix(v, "1:") {
					finalized[id] = true
				}
			}
			if (tc.crash == "after-finalize") != (len(finalized) > 0) {
				t.Fatalf("%d rows finalised before the child died at %s", len(finalized), tc.crash)
			}
			// A row more per aggregate, committed after the crash: the
			// successor sends it after the rows the child had in flight
			// (checkOrder), so the child's saved cursor is below those
			// (saveable); above them, the successor's first read took the
			// new rows, and its cold pass found the others after.
			e.insert(20, 20)

			r := e.poller(testConfig(), "")
			e.run(r)
			e.waitAllDispatched(30 * time.Second)
			dups := e.checkDelivered(ids)
			e.checkOrder()
			if tc.duplicatesExpect && dups == 0 {
				t.Fatalf("no duplicates after a crash between send and mark: the test did not hit the window")
			}
			if !tc.duplicatesExpect {
				// A finalised row is marked from its key, never sent again.
				ok := e.rc.OKCounts()
				resent := 0
				for id := range finalized {
					if ok[id] != 1 {
						resent++
					}
				}
				if resent != 0 || (tc.crash == "after-claim" && dups != 0) {
					t.Fatalf("%d finalised rows sent again, %d duplicates in all, after a crash at %s", resent, dups, tc.crash)
				}
			}
			if tc.crash == "after-finalize" {
				// Counted after the mark, which this test sees first.
				e.waitFor("rows marked from Redis' delivered keys counted", 10*time.Second,
					func() bool { return testutil.ToFloat64(r.m.Duplicates) >= float64(len(finalized)) })
			}
		})
	}
}

// A receiver down for a while (503) delays but loses nothing and keeps order.
func TestReceiverOutageRecovers(t *testing.T) {
	e := setup(t)
	ids := e.insert(300, 10)
	var mu sync.Mutex
	down := true
	e.rc.SetRespond(func(testkit.Request) testkit.Reply {
		mu.Lock()
		defer mu.Unlock()
		if down {
			return testkit.Reply{Status: http.StatusServiceUnavailable}
		}
		return testkit.Reply{Status: http.StatusOK}
	})
	r := e.poller(testConfig(), "")
	e.run(r)
	e.waitFor("failures recorded", 10*time.Second, func() bool { return e.count("attempts > 0") >= 10 })
	mu.Lock()
	down = false
	mu.Unlock()
	e.waitAllDispatched(30 * time.Second)
	e.checkDelivered(ids)
	e.checkOrder()
	if n := e.count("dead_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d rows dead-lettered by a temporary outage", n)
	}
	if testutil.ToFloat64(r.m.DispatchFailures) == 0 {
		t.Fatal("failures not counted")
	}
}

// 429 with Retry-After: the row is not retried before the receiver asked.
func TestRetryAfterIsHonoured(t *testing.T) {
	e := setup(t)
	e.insert(1, 1)
	e.rc.SetRespond(func(r testkit.Request) testkit.Reply {
		if r.Attempt == 1 {
			return testkit.Reply{Status: http.StatusTooManyRequests, Header: http.Header{"Retry-After": {"3"}}}
		}
		return testkit.Reply{Status: http.StatusOK}
	})
	cfg := testConfig()
	cfg.BackoffMax = 5 * time.Second // Retry-After is honoured up to backoff_max
	r := e.poller(cfg, "")
	e.run(r)
	e.waitFor("the 429 recorded", 10*time.Second, func() bool { return e.count("attempts = 1") == 1 })
	// Backoff alone would be <= 10 ms here; the row must wait for Retry-After.
	var wait time.Duration
	if err := e.st.Pool().QueryRow(context.Background(),
		`SELECT (available_at - now())::interval FROM outbox`).Scan(&wait); err != nil {
		t.Fatal(err)
	}
	if wait < 2*time.Second {
		t.Fatalf("retry scheduled in %s, want about 3s (Retry-After)", wait)
	}
	e.waitAllDispatched(15 * time.Second)
}

// 400 dead-letters at once; other aggregates keep flowing; replay delivers it.
func TestPermanentErrorDeadLettersAndReplayDelivers(t *testing.T) {
	e := setup(t)
	ids := e.insert(100, 10) // deal/0 .. deal/9
	var mu sync.Mutex
	reject := true
	e.rc.SetRespond(func(r testkit.Request) testkit.Reply {
		mu.Lock()
		defer mu.Unlock()
		if reject && r.Agg == "deal/3" {
			return testkit.Reply{Status: http.StatusBadRequest}
		}
		return testkit.Reply{Status: http.StatusOK}
	})
	r := e.poller(testConfig(), "")
	e.run(r)
	e.waitFor("all but deal/3 delivered, deal/3 dead", 20*time.Second, func() bool {
		return e.count("dispatched_at IS NULL AND dead_at IS NULL") == 0
	})
	if n := e.count("dead_at IS NOT NULL"); n != 10 || e.count("dead_at IS NOT NULL AND aggregate_id <> '3'") != 0 {
		t.Fatalf("%d dead rows, want deal/3's 10 only", n)
	}
	if e.count("dead_at IS NOT NULL AND attempts = 1") != 10 {
		t.Fatal("a 400 must dead-letter on the first attempt")
	}
	// Counted after the write, which this test sees first.
	e.waitFor("dead-lettered counter at 10", 10*time.Second, func() bool { return testutil.ToFloat64(r.m.DeadLettered) >= 10 })
	if got := testutil.ToFloat64(r.m.DeadLettered); got != 10 {
		t.Fatalf("dead-lettered counter %v, want 10", got)
	}

	mu.Lock()
	reject = false
	mu.Unlock()
	n, err := e.st.Reconcile().ReplayDead(context.Background(), store.Fence{Lock: "lock:reconciliation", Token: 1, Owner: "test-replay"}, store.Replay{Filter: store.ReplayFilter{AggregateType: "deal", AggregateID: "3"}, BatchSize: 4})
	if err != nil || n != 10 {
		t.Fatalf("replayed %d, err %v; want 10", n, err)
	}
	e.waitAllDispatched(20 * time.Second)
	e.checkDelivered(ids)
}

// Per-aggregate order holds across 10k events, 500 aggregates, concurrency
// 32 and 5% random failures.
func TestOrderUnderFailuresAtScale(t *testing.T) {
	if testing.Short() {
		t.Skip("10k events")
	}
	e := setup(t)
	ids := e.insert(10000, 500)
	rnd := rand.New(rand.NewPCG(1, 2))
	var mu sync.Mutex
	e.rc.SetRespond(func(testkit.Request) testkit.Reply {
		mu.Lock()
		defer mu.Unlock()
		if rnd.IntN(100) < 5 {
			return testkit.Reply{Status: http.StatusServiceUnavailable}
		}
		return testkit.Reply{Status: http.StatusOK}
	})
	cfg := testConfig()
	cfg.Concurrency, cfg.BatchSize, cfg.BackoffMax = 32, 500, 20*time.Millisecond
	e.run(e.poller(cfg, ""))
	e.waitAllDispatched(120 * time.Second)
	e.checkDelivered(ids)
	e.checkOrder()
	if e.count("dead_at IS NOT NULL") != 0 {
		t.Fatal("rows dead-lettered under 5% transient failures")
	}
}

// A leader paused (SIGSTOP) past its TTL is replaced; when it resumes, none
// of its old-token deliveries arrives after the new leader's, and its
// Postgres writes are refused by the fence.
func TestPausedLeaderIsFencedOut(t *testing.T) {
	e := setup(t)
	ids := e.insert(200, 10)
	// Hold the stale leader's first request for deal/0 so that its batch is in
	// flight when it is paused, with other aggregates already delivered.
	caught := false // Hold's matcher runs under the receiver's lock
	release := e.rc.Hold(func(r testkit.Request) bool {
		if caught || r.Token != 1 || r.Agg != "deal/0" {
			return false
		}
		caught = true
		return true
	})
	cfg := testConfig()
	cfg.LockTTL, cfg.BatchSize, cfg.Concurrency, cfg.ClaimTTL = time.Second, 50, 4, time.Second
	old := e.startChild("", cfg)
	e.waitFor("the old leader's request held and its other sends done", 10*time.Second, func() bool {
		if e.rc.Held() == 0 {
			return false
		}
		n := 0
		for _, r := range e.rc.Requests() {
			if r.Status != 0 {
				n++
			}
		}
		return n >= 10
	})
	old.signal(t, syscall.SIGSTOP)
	// The fault: paused past its lease, until after its successor took over.
	leased := func() bool { return e.rdb.Exists(context.Background(), e.prefix+keys.PollerLock).Val() != 0 }
	if !leased() {
		t.Fatal("premise: the old leader holds no lease when paused")
	}
	e.waitFor("the paused leader's lease expired", 10*cfg.LockTTL, func() bool { return !leased() })

	r := e.poller(testConfig(), "")
	e.run(r)
	e.waitAllDispatched(30 * time.Second)
	if tok := r.HeldToken(); tok < 2 {
		t.Fatalf("new leader's token %d, want > 1", tok)
	}

	old.signal(t, syscall.SIGCONT)
	release()
	e.waitFor("the resumed leader to be refused by the fence", 10*time.Second, func() bool {
		return strings.Contains(old.logs(), `"msg":"fence rejected"`)
	})
	old.signal(t, syscall.SIGTERM)
	if err := old.wait(); err != nil {
		t.Fatalf("old leader did not exit cleanly after resuming: %v\n%s", err, old.logs())
	}

	if v := testkit.TokenViolations(e.rc.Requests(), time.Time{}); len(v) > 0 {
		t.Fatalf("old token after a newer one: %s", strings.Join(v, "; "))
	}
	e.checkDelivered(ids)
	if e.count("dispatched_at IS NULL") != 0 {
		t.Fatal("rows left undelivered")
	}
	var fence int64
	if err := e.st.Pool().QueryRow(context.Background(), `SELECT token FROM outbox_fence WHERE lock_name = $1`, keys.PollerLock).Scan(&fence); err != nil {
		t.Fatalf("read the fence: %v", err)
	}
	if fence < 2 {
		t.Fatalf("fence %d, want the new leader's token", fence)
	}
}

// Split brain (two runners each believing they lead, as after a Redis
// failover that lost the key): the fence refuses the superseded one, no row
// is written after it was marked delivered, and fence tokens only rise.
func TestSplitBrainRunnersNeverOverwriteEachOther(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	audit := []string{
		`CREATE TABLE audit (id bigint, was_dispatched bool, attempts int, at timestamptz DEFAULT clock_timestamp())`,
		`CREATE TABLE fence_audit (seq bigserial, token bigint)`,
		`CREATE FUNCTION audit_outbox() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
		   INSERT INTO audit (id, was_dispatched, attempts) VALUES (OLD.id, OLD.dispatched_at IS NOT NULL, NEW.attempts);
		   RETURN NEW; END $$`,
		`CREATE TRIGGER audit_outbox AFTER UPDATE ON outbox FOR EACH ROW EXECUTE FUNCTION audit_outbox()`,
		`CREATE FUNCTION audit_fence() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
		   INSERT INTO fence_audit (token) VALUES (NEW.token); RETURN NEW; END $$`,
		`CREATE TRIGGER audit_fence AFTER INSERT OR UPDATE ON outbox_fence FOR EACH ROW EXECUTE FUNCTION audit_fence()`,
	}
	for _, sql := range audit {
		if _, err := e.st.Pool().Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	ids := e.insert(2000, 100)
	rnd := rand.New(rand.NewPCG(3, 4))
	var mu sync.Mutex
	e.rc.SetRespond(func(testkit.Request) testkit.Reply {
		time.Sleep(2 * time.Millisecond) // keep the first leader busy past the second's recovery wait
		mu.Lock()
		defer mu.Unlock()
		if rnd.IntN(100) < 20 {
			return testkit.Reply{Status: http.StatusServiceUnavailable}
		}
		return testkit.Reply{Status: http.StatusOK}
	})
	cfg := testConfig()
	cfg.BatchSize, cfg.Concurrency, cfg.LockTTL = 50, 4, 600*time.Millisecond
	a := e.poller(cfg, "")
	b := e.poller(cfg, e.prefix+"split:") // its own lock key: both hold "the" lock
	refused := func(r *runner) float64 {
		return testutil.ToFloat64(r.m.FenceRejections.WithLabelValues(keys.PollerLock))
	}
	stopA := e.run(a)
	stopB := e.run(b)
	// The split lasts until each runner was refused a few times (or the
	// rows ran out); then one runner with a lease that holds under load
	// delivers the rest. Both running to the last row took over a minute
	// at load 25 (each new term waits a TTL before its first write, the
	// two take turns, and 60 ms Redis calls lose leases), past the deadline.
	e.waitFor("each runner refused 3 times, or every row dispatched", 5*time.Minute, func() bool {
		return refused(a) >= 3 && refused(b) >= 3 || e.count("dispatched_at IS NULL") == 0
	})
	stopA()
	stopB()
	e.run(e.poller(testConfig(), ""))
	e.waitAllDispatched(5 * time.Minute)
	e.checkDelivered(ids)

	rejections := refused(a) + refused(b)
	if rejections == 0 {
		t.Fatal("two leaders ran and the fence refused nothing")
	}
	var rewritten int
	if err := e.st.Pool().QueryRow(ctx, `SELECT count(*) FROM audit WHERE was_dispatched`).Scan(&rewritten); err != nil {
		t.Fatalf("rewrite audit: %v", err)
	}
	if rewritten != 0 {
		t.Fatalf("%d writes to rows already marked delivered", rewritten)
	}
	// Collected first (the rows closed), checked after: failing inside the
	// iteration would leave the connection busy and cleanup's pool close
	// waiting for it until the test binary's timeout.
	rows, err := e.st.Pool().Query(ctx, `SELECT token FROM fence_audit ORDER BY seq`)
	if err != nil {
		t.Fatalf("fence audit: %v", err)
	}
	tokens, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatalf("fence audit: %v", err)
	}
	if len(tokens) == 0 {
		t.Fatal("fence audit is empty: the trigger recorded no fence write")
	}
	var prev int64
	for _, tok := range tokens {
		if tok < prev {
			t.Fatalf("fence went back from %d to %d", prev, tok)
		}
		prev = tok
	}
	t.Logf("fence rejections %v, final token %d", rejections, prev)
}

// SIGTERM-style shutdown lets the batch in flight finish, writes its results
// and releases the lock.
func TestShutdownFinishesInFlightThenReleases(t *testing.T) {
	e := setup(t)
	e.insert(20, 20)
	caught := false // Hold's matcher runs under the receiver's lock
	release := e.rc.Hold(func(testkit.Request) bool {
		first := !caught
		caught = true
		return first
	})
	r := e.poller(testConfig(), "")
	stop := e.run(r)
	e.waitFor("a request in flight", 10*time.Second, func() bool { return e.rc.Held() == 1 })
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("Run returned with a delivery in flight")
	case <-time.After(200 * time.Millisecond):
	}
	release()
	<-stopped
	if n := e.count("dispatched_at IS NULL"); n != 0 {
		t.Fatalf("%d rows of the in-flight batch not marked", n)
	}
	if e.rdb.Exists(context.Background(), e.prefix+keys.PollerLock).Val() != 0 {
		t.Fatal("lock not released")
	}
}

// With Redis unreachable a runner says so in its logs (and keeps trying);
// an outage must not look like a quiet standby.
func TestRedisOutageIsLogged(t *testing.T) {
	e := setup(t)
	down := testenv.StartRedisServer(t)
	down.Stop() // a port where nothing answers
	cfg := testConfig()
	cfg.KeyPrefix, cfg.LockWait = e.prefix, 200*time.Millisecond
	rdb := redis.NewClient(&redis.Options{Addr: down.Addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	defer rdb.Close()
	logs := &testkit.Logs{}
	r := New(cfg.Config, Deps{Store: e.st, Locks: redislease.New([]redis.UniversalClient{rdb}), Redis: rdb, Sink: dispatch.Noop{},
		Log: slog.New(slog.NewJSONHandler(logs, nil)), Metrics: metrics.New()})
	stop := e.run(&runner{r, nil})
	e.waitFor("an outage log line", 10*time.Second, func() bool {
		s := logs.String()
		return strings.Contains(s, `"msg":"lock attempt failed"`) && strings.Contains(s, "redis "+down.Addr)
	})
	stop()
}

// The per-event debug lines (docs/reference.md: "event delivered", per
// event with outbox_id) are still written at log.level debug, though
// finish builds them only when that level is on.
func TestEventDeliveredLoggedAtDebug(t *testing.T) {
	e := setup(t)
	ids := e.insert(3, 3)
	r, logs := e.loggedRunner(testConfig())
	e.run(r)
	e.waitAllDispatched(30 * time.Second)
	for _, id := range ids {
		want := fmt.Sprintf(`"outbox_id":%d}`, id)
		logs.WaitLines(t, 10*time.Second, "event delivered "+want, 1, func(line string) bool {
			return strings.Contains(line, `"level":"DEBUG","msg":"event delivered"`) && strings.Contains(line, want)
		})
	}
}
