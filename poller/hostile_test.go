package poller

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/internal/metrics"
	"github.com/outboxd/outboxd/internal/term"
	"github.com/outboxd/outboxd/internal/testkit"
	"github.com/outboxd/outboxd/lock"
)

// A crashed leader's claims are taken over at once by its successor (a
// higher token), not left to expire: with a claim TTL of an hour, every row
// is still delivered, in order, within seconds.
func TestCrashedLeadersClaimsAreTakenOver(t *testing.T) {
	e := newEnv(t)
	ids := e.insert(200, 20)
	cfg := testConfig()
	cfg.LockTTL, cfg.BatchSize, cfg.ClaimTTL = time.Second, 100, time.Hour
	c := e.startChild("after-send", cfg) // sent its batch, keys still say "claim"
	_ = c.wait()
	claims := 0
	for _, id := range ids {
		if v, _ := e.rdb.Get(context.Background(), e.prefix+"idempotency:notify:"+fmt.Sprint(id)).Result(); strings.HasPrefix(v, "claim:1:") {
			claims++
		}
	}
	if claims == 0 {
		t.Fatal("the crashed leader left no claims: the test did not hit the window")
	}
	cfg = testConfig()
	cfg.ClaimTTL = time.Hour
	r := e.poller(cfg, "")
	e.run(r)
	e.waitAllDispatched(20 * time.Second) // an hour without the takeover
	e.checkDelivered(ids)
	e.checkOrder()
	if got := testutil.ToFloat64(r.m.ClaimsTakenOver); got != float64(claims) {
		t.Fatalf("took over %v claims, want the %d the crashed leader left", got, claims)
	}
}

// A claim carrying a higher token than ours (a newer leader's) is left
// alone, and its aggregate waits behind it; other aggregates flow.
func TestNewerHoldersClaimIsLeftAlone(t *testing.T) {
	e := newEnv(t)
	ids := e.insert(20, 10) // deal/0 gets ids[0] and ids[10]
	key := e.prefix + "idempotency:notify:" + fmt.Sprint(ids[0])
	newer := "claim:999:someone-else:x"
	if err := e.rdb.Set(context.Background(), key, newer, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	r := e.poller(testConfig(), "")
	e.run(r)
	e.waitFor("the other aggregates delivered", 10*time.Second, func() bool {
		return e.count("dispatched_at IS NULL") == 2
	})
	for _, r := range e.rc.Requests() {
		if r.Agg == "deal/0" {
			t.Fatalf("event %d of the aggregate behind a newer claim was sent", r.ID)
		}
	}
	if v, _ := e.rdb.Get(context.Background(), key).Result(); v != newer {
		t.Fatalf("the newer claim was replaced by %q", v)
	}
	if n := e.count("attempts > 0"); n != 0 {
		t.Fatalf("%d rows counted attempts while waiting behind a live claim", n)
	}
}

// An idempotency key of the wrong type, or holding a value outboxd did not
// write, fails that row alone: counted, named in last_error, dead-lettered
// after max_attempts; every other row is delivered.
func TestPoisonedIdempotencyKeysFailTheirRowOnly(t *testing.T) {
	e := newEnv(t)
	ids := e.insert(30, 10)
	ctx := context.Background()
	hashKey := e.prefix + "idempotency:notify:" + fmt.Sprint(ids[3])
	oddKey := e.prefix + "idempotency:notify:" + fmt.Sprint(ids[4])
	if err := e.rdb.HSet(ctx, hashKey, "f", "v").Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.Set(ctx, oddKey, "garbage", 0).Err(); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	cfg.MaxAttempts = 3
	r := e.poller(cfg, "")
	e.run(r)
	e.waitFor("the two poisoned rows dead, all others delivered", 20*time.Second, func() bool {
		return e.count("dead_at IS NOT NULL") == 2 && e.count("dispatched_at IS NOT NULL") == 28
	})
	for _, c := range []struct {
		id   int64
		key  string
		want string
	}{{ids[3], hashKey, "WRONGTYPE"}, {ids[4], oddKey, `"garbage"`}} {
		var attempts int
		var lastErr string
		if err := e.st.Pool().QueryRow(ctx, `SELECT attempts, last_error FROM outbox WHERE id = $1`, c.id).Scan(&attempts, &lastErr); err != nil {
			t.Fatal(err)
		}
		if attempts != 3 || !strings.Contains(lastErr, c.key) || !strings.Contains(lastErr, c.want) {
			t.Errorf("row %d: attempts %d last_error %q; want 3 attempts, the key and %s named", c.id, attempts, lastErr, c.want)
		}
	}
	if typ, _ := e.rdb.Type(ctx, hashKey).Result(); typ != "hash" {
		t.Fatalf("the operator's key was changed to a %s", typ)
	}
}

// A row the fetch marks as poison (larger than max_payload_bytes) is
// dead-lettered at once, unsent, and does not block its aggregate.
func TestOversizedRowIsDeadLetteredAndItsAggregateFlows(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.st.Pool().Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		VALUES ('deal', '1', 'e', '{"n":1}'), ('deal', '1', 'e', jsonb_build_object('blob', repeat('x', 2000000))),
		       ('deal', '1', 'e', '{"n":3}')`); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	cfg.MaxPayloadBytes = 1 << 20
	r := e.poller(cfg, "")
	e.run(r)
	e.waitFor("two delivered, one dead", 10*time.Second, func() bool {
		return e.count("dispatched_at IS NOT NULL") == 2 && e.count("dead_at IS NOT NULL") == 1
	})
	if n := e.count("dead_at IS NOT NULL AND attempts = 1 AND last_error LIKE '%poller.max_payload_bytes%'"); n != 1 {
		t.Fatal("the oversized row's last_error does not name poller.max_payload_bytes")
	}
	if n := len(e.rc.Requests()); n != 2 {
		t.Fatalf("receiver got %d requests, want the 2 small rows only", n)
	}
	e.checkOrder()
}

// A receiver slower than the lease: the send is cut by the trust deadline
// while the lease is still held. Once is forgiven; the second cut of the same
// row counts as an attempt, with a WARN each time, so the row dead-letters
// instead of retrying forever.
func TestSendsCutByTheLeaseCountAsAttempts(t *testing.T) {
	e := newEnv(t)
	e.insert(1, 1)
	hang := dispatch.PerEvent(func(ctx context.Context, _ dispatch.Event, _ int64) error {
		<-ctx.Done() // never answers: each send ends only with its context
		return ctx.Err()
	}, 1, dispatch.Capabilities{})
	cfg := testConfig()
	cfg.LockTTL, cfg.MaxAttempts, cfg.KeyPrefix = time.Second, 2, e.prefix
	var logs testkit.Logs
	m := metrics.New()
	locks := lock.New([]redis.UniversalClient{e.rdb}, lock.WithKeyPrefix(e.prefix), lock.WithHooks(term.Hooks(m)))
	p := New(cfg.Config, Deps{Store: e.st, Locks: locks, Redis: e.rdb, Sink: hang, Log: slog.New(slog.NewJSONHandler(&logs, nil)), Metrics: m})
	e.run(&runner{p, m})
	e.waitFor("the row dead-lettered", 20*time.Second, func() bool { return e.count("dead_at IS NOT NULL") == 1 })
	if n := e.count("attempts = 2 AND last_error LIKE '%cut short by the lock''s trust deadline%'"); n != 1 {
		t.Fatal("the dead row does not say its sends were cut by the lease")
	}
	if got := strings.Count(logs.String(), `"msg":"send cut short by the lease"`); got < 4 {
		t.Fatalf("%d WARN lines for 4 cut sends:\n%s", got, logs.String())
	}
	if testutil.ToFloat64(m.SendsCut) < 4 {
		t.Fatalf("outboxd_sends_cut_total %v, want >= 4", testutil.ToFloat64(m.SendsCut))
	}
}

// Each wait is at least half its step and at most the step, so max_attempts
// states a minimum time before dead-lettering; Retry-After is honoured up to
// backoff_max and never beyond.
func TestBackoffHasAFloorAndRetryAfterAStop(t *testing.T) {
	cfg := Config{BackoffBase: time.Second, BackoffMax: time.Hour, MaxAttempts: 25}
	p := &Poller{cfg: cfg.withDefaults()}
	for attempts := range 24 {
		step := p.step(attempts + 1)
		for range 200 {
			it := item{err: &dispatch.Error{Err: fmt.Errorf("503")}}
			it.row.Attempts = attempts
			f := p.failure(it)
			if d := f.Delay; f.Dead || d < step/2 || d > step {
				t.Fatalf("after attempt %d: wait %s (dead %t), want within [%s, %s]", attempts+1, d, f.Dead, step/2, step)
			}
		}
	}
	it := item{err: &dispatch.Error{Err: fmt.Errorf("429"), RetryAfter: dispatch.MaxRetryAfter}}
	if d := p.failure(it).Delay; d != time.Hour {
		t.Fatalf("Retry-After of %s scheduled %s ahead, want backoff_max (1h)", dispatch.MaxRetryAfter, d)
	}
	lo, hi := RetryHorizon(cfg)
	// 1+2+...+2048 s, then 12 steps of an hour: 47,295 s; the floor half that.
	if hi != 47295*time.Second || lo != hi/2 {
		t.Fatalf("retry horizon [%s, %s], want [%s, %s]", lo, hi, 47295*time.Second/2, 47295*time.Second)
	}
	// The finding: 5 attempts from 1 s must outlast a 5 s outage.
	if lo, _ := RetryHorizon(Config{BackoffBase: time.Second, BackoffMax: time.Hour, MaxAttempts: 5}); lo < 7*time.Second {
		t.Fatalf("5 attempts survive at least %s, want 7.5s", lo)
	}
}
