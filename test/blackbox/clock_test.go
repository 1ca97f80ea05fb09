package blackbox

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/internal/testkit"
)

// The built binary against a Postgres whose clock is ahead of the relay's
// or behind it, by seconds and by an hour (DESIGN "Time"): the first event
// of an aggregate keeps failing (503 with Retry-After: 1), and the
// aggregate's later events wait for it; it is retried after its backoff
// (available_at = Postgres's now() + at most poller.backoff_max, so it is
// backing off, after created_at, and never an hour out); /status and
// outboxd_pending_events count all three pending; once the receiver
// accepts, the three arrive in id order. With available_at from the
// relay's clock, a relay behind Postgres wrote it before created_at: the
// later events went first and the failed one waited for the rescan,
// uncounted; a relay ahead of Postgres held it back by the difference.
func TestOrderAndRetriesWhateverPostgresClock(t *testing.T) {
	t.Parallel()
	for _, offset := range []time.Duration{5 * time.Second, -5 * time.Second, time.Hour, -time.Hour} {
		t.Run(fmt.Sprintf("postgres%+ds", int(offset.Seconds())), func(t *testing.T) {
			t.Parallel()
			clockCase(t, offset)
		})
	}
}

func clockCase(t *testing.T, offset time.Duration) {
	e := clockEnv(t, offset)
	var failing atomic.Int64 // the id the receiver refuses, 0: none
	rc := newRecorder(t, func(req testkit.Request) testkit.Reply {
		if req.ID != 0 && req.ID == failing.Load() {
			return testkit.Reply{Status: 503, Header: http.Header{"Retry-After": {"1"}}}
		}
		return testkit.Reply{}
	})
	e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", rc.URL())
	rep := e.start()
	// The relay has read (and saved its cursor) before the aggregate's
	// rows come, as in a relay that runs.
	warm := e.insert("deal", "warm", `{}`, "")
	waitFor(t, "the relay delivering", func() bool { return rc.OKCounts()[warm] > 0 }, e.describeRows("true"))

	// Refused from its first request on: the next id, this test being
	// the database's only producer.
	failing.Store(warm + 1)
	first := e.insert("deal", "A", `{"n":1}`, "")
	if first != warm+1 {
		t.Fatalf("the aggregate's first row got id %d, want %d (the one after the warm-up row)", first, warm+1)
	}
	later := []int64{e.insert("deal", "A", `{"n":2}`, ""), e.insert("deal", "A", `{"n":3}`, "")}
	all := "id >= $1"
	waitFor(t, "the first event failing and retried twice", func() bool { return e.row(first).Attempts >= 3 },
		e.describeRows(all, first))

	for _, id := range later {
		for _, r := range rc.Requests() {
			if r.ID == id {
				t.Fatalf("event %d was sent while %d, earlier in its aggregate, failed:\n%s", id, first, e.describeRows(all, first)())
			}
		}
	}
	var after, within bool
	if err := e.pool.QueryRow(context.Background(), `SELECT available_at > created_at, available_at <= now() + interval '1 second'
		FROM outbox WHERE id = $1 AND dispatched_at IS NULL`, first).Scan(&after, &within); err != nil {
		t.Fatal(err)
	}
	if !after || !within {
		t.Fatalf("the failed event's available_at: after created_at %v, within backoff_max of Postgres's now() %v:\n%s",
			after, within, e.describeRows(all, first)())
	}
	if _, body := rep.get("/status"); statusPending(t, body) != 3 {
		t.Fatalf("/status counts %d pending events, want the 3 of the aggregate: %s", statusPending(t, body), trunc(body, 500))
	}
	waitFor(t, "outboxd_pending_events 3", func() bool {
		_, m := rep.get("/metrics")
		return strings.Contains(m, "\noutboxd_pending_events 3\n")
	}, func() string { _, m := rep.get("/metrics"); return grepLines(m, "outboxd_pending_events") })

	failing.Store(0)
	waitFor(t, "the aggregate delivered", func() bool {
		ok := rc.OKCounts()
		return ok[first] > 0 && ok[later[0]] > 0 && ok[later[1]] > 0
	}, e.describeRows(all, first))
	if v := testkit.OrderViolations(rc.Requests()); len(v) > 0 {
		t.Fatalf("order broken: %v", v)
	}
	if late := rep.logsMatching(func(_ string, rec map[string]any) bool { return rec["msg"] == "late commit" }); len(late) > 0 {
		t.Errorf("a row of one producer at a time was taken for a late commit: %s", late[0])
	}
}

// clockEnv is setup on a private Postgres whose clock is offset from the
// machine's (and so the relay's).
func clockEnv(t *testing.T, offset time.Duration) *testBundle {
	t.Helper()
	pg := testenv.StartPostgresServerClock(t, offset)
	return envOn(t, testenv.StoreAt(t, pg.DSN).Pool(), pg.DSN)
}

// statusPending is /status's pending count.
func statusPending(t *testing.T, body string) int64 {
	t.Helper()
	var st struct{ Pending int64 }
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("/status: %v: %s", err, trunc(body, 300))
	}
	return st.Pending
}

// `dead list --since/--until` with a duration counts back from Postgres's
// now(), the clock that wrote dead_at: with Postgres an hour ahead of the
// CLI's clock or an hour behind it, --since 1h lists the row dead-lettered
// 30 minutes ago and --until 1h the one of 90 minutes ago.
func TestDeadListDurationsCountOnPostgresClock(t *testing.T) {
	t.Parallel()
	for _, offset := range []time.Duration{time.Hour, -time.Hour} {
		t.Run(fmt.Sprintf("postgres%+ds", int(offset.Seconds())), func(t *testing.T) {
			t.Parallel()
			e := clockEnv(t, offset)
			var recent, old int64
			if err := e.pool.QueryRow(context.Background(), `WITH r AS (
				INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, attempts, last_error, dead_at)
				VALUES ('deal', 'recent', 'test.event', '{}', 1, '400', now() - interval '30 minutes'),
				       ('deal', 'old', 'test.event', '{}', 1, '400', now() - interval '90 minutes') RETURNING id, aggregate_id)
				SELECT (SELECT id FROM r WHERE aggregate_id = 'recent'), (SELECT id FROM r WHERE aggregate_id = 'old')`).Scan(&recent, &old); err != nil {
				t.Fatal(err)
			}
			for _, c := range []struct {
				flag string
				want int64
			}{{"--since", recent}, {"--until", old}} {
				res := runBinary(t, e.vars, exitLimit, "dead", "list", c.flag, "1h", "--json")
				var page struct{ Events []struct{ ID int64 } }
				if res.code != 0 || json.Unmarshal([]byte(res.stdout), &page) != nil {
					t.Fatalf("dead list %s 1h: %s", c.flag, res)
				}
				if len(page.Events) != 1 || page.Events[0].ID != c.want {
					t.Errorf("dead list %s 1h listed %+v, want row %d alone (recent %d, old %d)", c.flag, page.Events, c.want, recent, old)
				}
			}
		})
	}
}
