package blackbox

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/internal/testkit"
)

// Ids that come round again (a sequence rewind) never find the delivered
// marks of the earlier rows that had them. Each path delivers 5 rows,
// rewinds the ids, inserts 8 rows and requires the receiver to get all 8
// (a row taken for delivered by another's mark is marked, never received).

func TestRewindTruncateRestartIdentity(t *testing.T) {
	t.Parallel()
	testRewind(t, func(e *testBundle, _ *replica) (*testBundle, *replica) {
		e.exec(`TRUNCATE outbox RESTART IDENTITY`)
		return e, nil
	})
}

func TestRewindSequenceRestart(t *testing.T) {
	t.Parallel()
	testRewind(t, func(e *testBundle, _ *replica) (*testBundle, *replica) {
		// The delivered rows are gone (a purge), then the sequence restarts.
		e.exec(`DELETE FROM outbox`)
		e.exec(`ALTER TABLE outbox ALTER COLUMN id RESTART`)
		return e, nil
	})
}

// The database is dropped and created again (here: a new, migrated
// database) under the same redis.key_prefix; the relay restarts on it.
func TestRewindDatabaseRecreated(t *testing.T) {
	t.Parallel()
	testRewind(t, func(e *testBundle, rep *replica) (*testBundle, *replica) {
		rep.stop()
		st, dsn := testenv.Store(t)
		e2 := &testBundle{t: t, pool: st.Pool(), dsn: dsn, rdb: e.rdb, prefix: e.prefix, vars: map[string]string{}}
		for k, v := range e.vars {
			e2.vars[k] = v
		}
		e2.vars["OUTBOXD_POSTGRES_DSN"] = dsn
		return e2, e2.start()
	})
}

// testRewind runs one rewind path: rewind gets the env and the running
// replica and returns the env (and, if it started one, the replica) to go
// on with.
func testRewind(t *testing.T, rewind func(*testBundle, *replica) (*testBundle, *replica)) {
	e := setup(t)
	rc := newRecorder(t, nil)
	// Batches of 2: the foreign keys are found over several batches of one
	// term, which logs the rewind once.
	e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", rc.URL(), "OUTBOXD_POLLER_BATCH_SIZE", "2")
	rep := e.start()

	e.insertGen(1, 5)
	waitFor(t, "generation 1 delivered", func() bool { return e.count(`dispatched_at IS NULL`) == 0 }, e.describeRows("true"))
	if got := okGen(rc, 1); len(got) != 5 {
		t.Fatalf("generation 1: receiver got %d of 5 events", len(got))
	}

	if e2, rep2 := rewind(e, rep); rep2 != nil {
		e, rep = e2, rep2
	} else {
		e = e2
	}
	ids := e.insertGen(2, 8)
	if ids[0] != 1 {
		t.Fatalf("the rewind did not rewind: the first new id is %d", ids[0])
	}
	e.waitSettled(rep, "generation 2 settled")

	marked := e.count(`dispatched_at IS NOT NULL`)
	got := okGen(rc, 2)
	t.Logf("after the rewind: %d of 8 rows marked delivered, receiver got %d of 8", marked, len(got))
	if marked != 8 || len(got) != 8 {
		t.Errorf("want 8 marked and 8 received; got %d marked, %d received (%v)", marked, len(got), got)
	}
	for n, c := range got {
		if c != 1 {
			t.Errorf("generation 2 event %d received %d times, want once", n, c)
		}
	}
	// Ids 1..5 found keys of generation 1: one ERROR for the term, each
	// foreign key counted.
	rewinds := rep.logsMatching(func(_ string, rec map[string]any) bool {
		return rec["level"] == "ERROR" && rec["msg"] == "sequence rewind detected"
	})
	if len(rewinds) != 1 {
		t.Errorf("want one ERROR %q, got %d; logs:\n%s", "sequence rewind detected", len(rewinds), rep.tail(20))
	} else if !strings.Contains(rewinds[0], `"outbox_id":`) {
		t.Errorf("the rewind log names no outbox_id: %s", rewinds[0])
	}
	if n := rep.metric(t, "outboxd_idempotency_foreign_total"); n != 5 {
		t.Errorf("outboxd_idempotency_foreign_total = %v, want 5", n)
	}
}

// A negative attempts value (an operator "giving more retries")
// on a row that fails once must not crash the relay: it counts from 0, the
// row retries and is delivered, and every other row is delivered exactly
// once. A huge attempts value dead-letters without overflowing.
func TestNegativeAttemptsDoNotCrash(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rc := newRecorder(t, func(req testkit.Request) testkit.Reply {
		if strings.HasPrefix(req.Agg, "odd/") && req.Attempt == 1 {
			return testkit.Reply{Status: http.StatusServiceUnavailable}
		}
		return testkit.Reply{Status: http.StatusNoContent}
	})
	e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", rc.URL())
	neg := e.insert("odd", "negative", `{}`, "")
	huge := e.insert("odd", "huge", `{}`, "")
	e.exec(`UPDATE outbox SET attempts = -5 WHERE id = ` + strconv.FormatInt(neg, 10))
	e.exec(`UPDATE outbox SET attempts = 2147483647 WHERE id = ` + strconv.FormatInt(huge, 10))
	others := e.insertMany("ok", 4, 3)
	rep := e.start()

	waitFor(t, "every row settled", func() bool {
		if rep.exited() {
			t.Fatalf("the relay exited: %v\nstderr: %s\nlogs:\n%s", rep.proc.Err(), trunc(rep.stderrText(), 2000), rep.tail(10))
		}
		return e.count(`dispatched_at IS NULL AND dead_at IS NULL`) == 0
	}, e.describeRows("true"))

	if w := e.row(neg); !w.Dispatched || w.Attempts != 1 {
		t.Errorf("attempts -5, failed once: want delivered with attempts 1 (counted from 0); got %s", w)
	}
	if w := e.row(huge); !w.Dead || w.Attempts != 2147483647 {
		t.Errorf("attempts 2147483647, failed once: want dead-lettered, attempts unchanged; got %s", w)
	}
	ok := rc.OKCounts()
	for _, id := range others {
		if ok[id] != 1 {
			t.Errorf("row %d received %d times, want exactly once", id, ok[id])
		}
	}
}

// exec runs one SQL statement on the test's database.
func (e *testBundle) exec(sql string) {
	e.t.Helper()
	if _, err := e.pool.Exec(context.Background(), sql); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
}

// insertGen inserts n rows whose payloads say {"gen": gen, "n": i}, one
// statement, and returns their ids.
func (e *testBundle) insertGen(gen, n int) []int64 {
	e.t.Helper()
	return e.insertIDs(`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		 SELECT 'rw', (g % 3)::text, 'test.event', jsonb_build_object('gen', $1::int, 'n', g)
		 FROM generate_series(1, $2::int) g ORDER BY g RETURNING id`, gen, n)
}

// waitSettled waits until no row is pending, failing at once if the
// relay exits.
func (e *testBundle) waitSettled(rep *replica, what string) {
	e.t.Helper()
	waitFor(e.t, what, func() bool {
		if rep.exited() {
			e.t.Fatalf("the relay exited: %v; logs:\n%s", rep.proc.Err(), rep.tail(20))
		}
		return e.count(`dispatched_at IS NULL AND dead_at IS NULL`) == 0
	}, e.describeRows("true"))
}

// insertIDs runs an INSERT ... RETURNING id and returns the ids.
func (e *testBundle) insertIDs(sql string, args ...any) []int64 {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), sql, args...)
	if err != nil {
		e.t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		e.t.Fatal(err)
	}
	return ids
}

// okGen counts the 2xx answers per event of one generation (by payload n:
// ids repeat across generations).
func okGen(rc *testkit.Receiver, gen int) map[int]int {
	out := map[int]int{}
	for _, r := range rc.Requests() {
		var ev struct {
			Payload struct{ Gen, N int } `json:"payload"`
		}
		if r.OK() && json.Unmarshal(r.Body, &ev) == nil && ev.Payload.Gen == gen {
			out[ev.Payload.N]++
		}
	}
	return out
}

// metric reads one unlabelled series from the replica's /metrics (-1 when
// absent).
func (r *replica) metric(t *testing.T, name string) float64 {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + r.addr + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("metric %s: %v", name, err)
			}
			return f
		}
	}
	return -1
}
