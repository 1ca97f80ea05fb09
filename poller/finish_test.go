package poller

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/dispatch/webhook"
	"github.com/outboxd/outboxd/internal/keys"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A row the fetch marks as poison (larger than max_payload_bytes) is
// dead-lettered at once, unsent, and does not block its aggregate.
func TestOversizedRowIsDeadLetteredAndItsAggregateFlows(t *testing.T) {
	e := setup(t)
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
	it := item{err: &dispatch.Error{Err: fmt.Errorf("429"), RetryAfter: webhook.MaxRetryAfter}}
	if d := p.failure(it).Delay; d != time.Hour {
		t.Fatalf("Retry-After of %s scheduled %s ahead, want backoff_max (1h)", webhook.MaxRetryAfter, d)
	}
	lo, hi := RetryHorizon(cfg)
	// 1+2+...+2048 s, then 12 steps of an hour: 47,295 s; the floor half that.
	if hi != 47295*time.Second || lo != hi/2 {
		t.Fatalf("retry horizon [%s, %s], want [%s, %s]", lo, hi, 47295*time.Second/2, 47295*time.Second)
	}
	// 5 attempts from 1 s outlast a 5 s outage.
	if lo, _ := RetryHorizon(Config{BackoffBase: time.Second, BackoffMax: time.Hour, MaxAttempts: 5}); lo < 7*time.Second {
		t.Fatalf("5 attempts survive at least %s, want 7.5s", lo)
	}
}

// Result writes commit asynchronously (store.Complete). A Postgres crash
// right after a drain forgets the last of them; the rows come back pending,
// and the next runner finds them delivered in Redis and marks them without
// sending them again: the crash costs no duplicate delivery here, and could
// cost at most duplicates if Redis had lost the keys too.
func TestPostgresCrashForgetsResultsButSendsNothingTwice(t *testing.T) {
	e := setup(t)
	pg, st := e.privatePostgres()
	ctx := context.Background()
	// The WAL writer flushes asynchronous commits every wal_writer_delay:
	// make that longer than the test, so the crash finds them unwritten
	// (set at a restart: a reload reaches the WAL writer only when it wakes).
	// Any synchronous commit flushes them too: no autovacuum, and a lease
	// long enough that a loaded machine does not lose and re-claim it (the
	// fence claim commits synchronously).
	for _, set := range []string{`ALTER SYSTEM SET wal_writer_delay = '10s'`, `ALTER SYSTEM SET autovacuum = off`} {
		if _, err := st.Pool().Exec(ctx, set); err != nil {
			t.Fatal(err)
		}
	}
	pg.CrashRestart()
	st.Pool().Reset()
	ids := e.insert(50, 10) // producers commit synchronously
	cfg := testConfig()
	cfg.BatchSize, cfg.LockTTL = 10, 10*time.Second
	stop := e.run(e.poller(cfg, ""))
	e.waitAllDispatched(30 * time.Second)
	stop()

	pg.CrashRestart()
	st.Pool().Reset() // the pool's connections died with the server
	lost := e.count("dispatched_at IS NULL")
	if lost == 0 {
		t.Fatal("the crash forgot no result write: Complete committed synchronously")
	}
	r := e.poller(cfg, "")
	e.run(r)
	e.waitAllDispatched(30 * time.Second)
	if dups := e.checkDelivered(ids); dups != 0 {
		t.Fatalf("%d events sent twice after the crash", dups)
	}
	// The count follows the mark, which other sessions see first.
	e.waitFor("the forgotten rows counted as already delivered", 10*time.Second,
		func() bool { return testutil.ToFloat64(r.m.Duplicates) >= float64(lost) })
	if got := testutil.ToFloat64(r.m.Duplicates); got != float64(lost) {
		t.Fatalf("%v rows marked from Redis' delivered keys, want the %d whose marks the crash forgot", got, lost)
	}
}

// A failed delivery releases its claim (DESIGN, delivery protocol, step 5:
// "Failure: delete the claim"): the row's idempotency key is gone while it
// backs off, so nothing but its own retry decides when it goes again, and
// that retry takes over no claim. Left in place, the retry took over the
// term's own claim and counted it in outboxd_claims_taken_over_total.
func TestFailedDeliveryReleasesItsClaim(t *testing.T) {
	e := setup(t)
	x1, cfg := e.refusedOnce("2")
	cfg.ClaimTTL = time.Minute
	r := e.poller(cfg, "")
	e.run(r)
	e.waitFor("the row refused with Retry-After", 20*time.Second, func() bool { return e.count("attempts = 1") == 1 })
	key := keys.New(e.prefix).Idempotency(x1)
	if n, err := e.rdb.Exists(context.Background(), key).Result(); err != nil || n != 0 {
		v, _ := e.rdb.Get(context.Background(), key).Result()
		t.Fatalf("after the failure the row's key %s holds %q (%v), want none", key, v, err)
	}
	e.waitFor("the row delivered on its retry", 30*time.Second, func() bool { return e.delivered(x1) })
	if n := testutil.ToFloat64(r.m.ClaimsTakenOver); n != 0 {
		t.Fatalf("outboxd_claims_taken_over_total %v after one holder's retry, want 0", n)
	}
}
