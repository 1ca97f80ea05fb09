package blackbox

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/internal/testkit"
)

// viaBouncer points the replicas at a PgBouncer of the test's own (pool_mode
// transaction, its defaults otherwise) in front of the test's database.
func (e *testBundle) viaBouncer(extra ...string) *testenv.PgBouncer {
	b := testenv.StartPgBouncer(e.t, e.dsn, extra...)
	e.set("OUTBOXD_POSTGRES_DSN", b.Via(e.dsn))
	return b
}

// Behind a transaction pooler without postgres.pooler, `run` stops at start
// naming the key: PgBouncer refuses the planner settings' startup
// parameters, or (told to ignore them) drops them.
func TestPoolerNotDeclaredStopsTheStart(t *testing.T) {
	for _, tc := range []struct {
		name  string
		extra []string
	}{
		{name: "refused"},
		{name: "ignored", extra: []string{"ignore_startup_parameters = jit, plan_cache_mode, enable_seqscan, max_parallel_workers_per_gather"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := setup(t)
			e.viaBouncer(tc.extra...)
			res := runBinary(t, e.vars, time.Minute, "run")
			if res.code != 2 || !strings.Contains(res.stderr, "postgres.pooler") {
				t.Fatalf("run behind PgBouncer without postgres.pooler: %s; want exit 2 naming postgres.pooler", res)
			}
			if tc.extra != nil {
				return
			}
			for _, args := range [][]string{{"migrate"}, {"dead", "list"}, {"status"}} {
				if res := runBinary(t, e.vars, time.Minute, args...); res.code != 2 || !strings.Contains(res.stderr, "postgres.pooler") {
					t.Errorf("%v behind PgBouncer without postgres.pooler: %s; want exit 2 naming postgres.pooler", args, res)
				}
			}
		})
	}
}

// With postgres.pooler: transaction, poller.notify: true stops the start
// naming both keys: LISTEN needs a session of its own.
func TestPoolerTransactionRefusesNotify(t *testing.T) {
	e := setup(t)
	e.viaBouncer()
	e.set("OUTBOXD_POSTGRES_POOLER", "transaction", "OUTBOXD_POLLER_NOTIFY", "true")
	res := runBinary(t, e.vars, time.Minute, "run")
	if res.code != 2 || !strings.Contains(res.stderr, "poller.notify") || !strings.Contains(res.stderr, "postgres.pooler") {
		t.Fatalf("run with poller.notify: %s; want exit 2 naming poller.notify and postgres.pooler", res)
	}
}

// Through PgBouncer in transaction mode: migrate, then, as a role of the
// test's own with data rights only and no settings (no ALTER ROLE ...
// SET), delivery by two replicas with the leader killed mid-run (nothing
// lost, each aggregate's order kept), then the one-shot commands.
func TestPoolerTransactionDeliversAcrossFailover(t *testing.T) {
	e := setup(t)
	relay, relayDSN := e.role("relay")
	e.exec(relayGrants("public", relay))
	b := testenv.StartPgBouncerFor(t, e.dsn, []string{relay})
	e.set("OUTBOXD_POSTGRES_DSN", b.Via(e.dsn), "OUTBOXD_POSTGRES_POOLER", "transaction")

	if res := runBinary(t, e.vars, time.Minute, "migrate"); res.code != 0 || !strings.Contains(res.stdout, `"applied":0`) {
		t.Fatalf("migrate through PgBouncer on a migrated database: %s", res)
	}
	e.set("OUTBOXD_POSTGRES_DSN", b.Via(relayDSN))
	rc := newRecorder(t, nil)
	e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", rc.URL())
	ids := e.insertMany("acct", 10, 40)
	first := e.start()
	e.set("OUTBOXD_HTTP_ADDR", freeAddr(t))
	second := e.start()
	rc.WaitDelivered(t, 2*time.Minute, len(ids)/4)
	leader := first
	if leads(t, second) {
		leader = second
	}
	leader.kill()
	testkit.WaitFor(t, 2*time.Minute, "every row delivered after the kill", func() bool {
		return e.count("dispatched_at IS NULL") == 0
	}, e.describeRows("dispatched_at IS NULL LIMIT 20"))

	ok := rc.OKCounts()
	for _, id := range ids {
		if ok[id] == 0 {
			t.Errorf("event %d never delivered", id)
		}
	}
	// Order: each aggregate's first deliveries arrive in id order.
	last := map[string]int64{}
	done := map[int64]bool{}
	for _, r := range rc.Requests() {
		if !r.OK() || done[r.ID] {
			continue
		}
		done[r.ID] = true
		if r.ID < last[r.Agg] {
			t.Errorf("aggregate %s: event %d delivered after %d", r.Agg, r.ID, last[r.Agg])
		}
		last[r.Agg] = max(last[r.Agg], r.ID)
	}
	if n := e.count("dead_at IS NOT NULL"); n != 0 {
		t.Errorf("%d dead rows", n)
	}

	// The one-shot commands keep no session state either.
	e.exec(`UPDATE outbox SET dead_at = now(), dispatched_at = NULL, last_error = 'x' WHERE id = ` + strconv.FormatInt(ids[0], 10))
	for _, args := range [][]string{{"dead", "list", "--json"}, {"replay", "--dead"}, {"status"}} {
		if res := runBinary(t, e.vars, time.Minute, args...); res.code != 0 {
			t.Errorf("%v through PgBouncer: %s", args, res)
		}
	}
	testkit.WaitFor(t, time.Minute, "the replayed row delivered again", func() bool {
		return e.count("dead_at IS NULL AND dispatched_at IS NOT NULL AND id = "+strconv.FormatInt(ids[0], 10)) == 1
	}, e.describeRows("id = "+strconv.FormatInt(ids[0], 10)))

	// Reconciliation through PgBouncer records its run with its summary.
	if res := runBinary(t, e.vars, time.Minute, "reconcile", "--once"); res.code != 0 {
		t.Fatalf("reconcile --once through PgBouncer: %s", res)
	}
	var finished int
	if err := e.pool.QueryRow(context.Background(),
		`SELECT count(*) FROM reconcile_runs WHERE finished_at IS NOT NULL AND summary IS NOT NULL`).Scan(&finished); err != nil {
		t.Fatal(err)
	}
	if finished != 1 {
		t.Errorf("reconcile --once through PgBouncer: %d runs finished with a summary, want 1", finished)
	}

}
