package poller

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxd/outboxd/internal/testkit"
	"github.com/outboxd/outboxd/store"
)

// statementCounter counts the relay's statements by a marker in their text,
// and the rows each kind returned.
type statementCounter struct {
	mu    sync.Mutex
	calls map[string]int
	rows  map[string]int64
}

type startKey struct{}

func (c *statementCounter) kind(sql string) string {
	switch {
	case strings.Contains(sql, "hot AS MATERIALIZED"):
		return "read"
	case strings.Contains(sql, "dispatched_at IS NOT NULL"):
		return "late check" // store.ReadPath.LaterSent, store.ReadPath.InheritedLate
	}
	return ""
}

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, startKey{}, c.kind(d.SQL))
}

func (c *statementCounter) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	k, _ := ctx.Value(startKey{}).(string)
	if k == "" || d.Err != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls[k]++
	c.rows[k] += d.CommandTag.RowsAffected()
}

// countStatements makes e's store count its statements.
func (e *testBundle) countStatements() *statementCounter {
	e.t.Helper()
	counter := &statementCounter{calls: map[string]int{}, rows: map[string]int64{}}
	pc, err := pgxpool.ParseConfig(e.dsn)
	if err != nil {
		e.t.Fatal(err)
	}
	pc.ConnConfig.Tracer = counter
	st, err := store.OpenConfig(context.Background(), pc)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(st.Close)
	e.st = st
	return counter
}

func (c *statementCounter) get(k string) (int, int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[k], c.rows[k]
}

// A relay started onto a backlog with no cursor saved takes the table's
// highest id as the sent mark, so every row it drains lies at or below the
// mark and is checked for a late commit across the change of holder. What
// the holders before it dispatched there is read once a term, not once per
// read: per read it would walk (lowest row taken, mark], the rest of the
// backlog, and a drain would grow quadratic. The backlog cycles through as many aggregates
// as a batch holds, as the bench's does.
func TestBacklogDrainChecksInheritedRowsOnce(t *testing.T) {
	e := setup(t)
	const rows, aggregates = 3000, 100
	ids := e.insert(rows, aggregates)
	counter := e.countStatements()
	cfg := testConfig()
	cfg.BatchSize = aggregates
	e.run(e.poller(cfg, ""))
	e.waitAllDispatched(2 * time.Minute)
	e.checkDelivered(ids)

	reads, returned := counter.get("read")
	checks, _ := counter.get("late check")
	t.Logf("%d events: %d reads returned %d rows, %d late-commit checks", rows, reads, returned, checks)
	if reads < rows/aggregates {
		t.Fatalf("%d reads for %d rows at batch %d: the counter missed them", reads, rows, aggregates)
	}
	if checks > 1 {
		t.Fatalf("%d late-commit check statements in a drain of %d reads, want 1 (once a term)", checks, reads)
	}
}

// The same with more aggregates dispatched in the inherited range than a
// term keeps (one event per order: the cap is lowered here to 1,000 so the
// table stays small): the check of what earlier holders dispatched is still
// one statement a term. Held per aggregate (DispatchedAbove, capped at
// 100,000), it fell back to a LaterSent walk up to the mark in every read:
// 31 statements for this drain, a 1M drain over 1M orders quadratic.
// The range reaches down into the dispatched history because a row there
// backs off: a start with no cursor saved begins below it, the mark at the
// table's highest id.
func TestBacklogDrainOverManyAggregatesChecksOnce(t *testing.T) {
	e := setup(t)
	const history, backlog = 2000, 3000 // an aggregate each
	ids := e.insert(history+backlog, history+backlog)
	ctx := context.Background()
	if _, err := e.st.Pool().Exec(ctx, `UPDATE outbox SET dispatched_at = now() WHERE id > $1 AND id <= $2`, ids[0], ids[history-1]); err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.Pool().Exec(ctx, `UPDATE outbox SET attempts = 1, available_at = now() + interval '1 second' WHERE id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	counter := e.countStatements()
	r := e.poller(testConfig(), "")
	r.maxInherit = 1000
	e.run(r)
	e.waitAllDispatched(2 * time.Minute)
	e.checkDelivered(slices.Concat(ids[:1], ids[history:]))

	reads, returned := counter.get("read")
	checks, walked := counter.get("late check")
	t.Logf("%d events over as many aggregates behind %d dispatched: %d reads returned %d rows, %d late-commit checks returned %d rows",
		backlog, history, reads, returned, checks, walked)
	if reads < backlog/100 {
		t.Fatalf("%d reads for %d rows at batch 100: the counter missed them", reads, backlog)
	}
	if checks > 1 {
		t.Fatalf("%d late-commit check statements in a drain of %d reads over %d aggregates dispatched in the range (more than the %d a term keeps), want 1 (once a term)",
			checks, reads, history, r.maxInherit)
	}
}

// A late commit across a change of holder is warned and counted too: the
// first holder gives up the gap and delivers the higher id, then stops; the
// gap commits under the second holder, which knows what went first only
// from the sent mark saved beside the cursor.
func TestLateCommitAfterTheLeaseMovedIsWarnedAndCounted(t *testing.T) {
	e := setup(t)
	cfg := testConfig()
	cfg.GapWait = 300 * time.Millisecond
	cfg.LockTTL = 30 * time.Second // one term per runner (the test counts them)
	r1, logs1 := e.loggedRunner(cfg)
	stop1 := e.run(r1)
	warm := e.produce("warm")
	e.waitFor("the first runner delivering", time.Minute, func() bool { return e.delivered(warm) })
	lower := e.race("A")
	higher := e.produce("A")
	e.waitFor("the higher id delivered past gap_wait", time.Minute, func() bool { return e.delivered(higher) })
	e.waitFor("the sent mark saved", time.Minute, func() bool { return e.savedSent() >= higher })
	stop1()
	if n := logs1.Count(`"msg":"late commit"`); n != 0 {
		t.Fatalf("the first runner warned %d times before the commit", n)
	}

	r2, logs2 := e.loggedRunner(cfg)
	e.run(r2)
	logs2.WaitLine(t, time.Minute, `"msg":"read path starts"`)
	lower.commit(t)
	e.waitFor("the late row delivered", time.Minute, func() bool { return e.delivered(lower.id) })
	if n := logs2.Count(`"msg":"lock acquired"`); n != 1 {
		t.Fatalf("%d terms of the second runner, want one (the test's premise); last lines:\n%s", n, logs2.Tail(20))
	}
	expectLateCommit(t, logs2, r2, lower.id, higher)
}

// The same when the late row's producer is still in flight at the moment
// the new holder reads, once a term, what the range looked like (a row of
// another aggregate above the gap, refused by the first holder's sink and
// retried, is its first take there): the late row's id was missing then, so it is looked up when taken
// (store.ReadPath.InheritedLate's holes), not settled from that read.
func TestLateCommitInFlightAtTheNewHoldersCheckIsWarned(t *testing.T) {
	e := setup(t)
	cfg := testConfig()
	cfg.GapWait = 300 * time.Millisecond
	cfg.LockTTL = 30 * time.Second
	lower, higher, refused := e.gapGivenUpBesideARefusedRow(cfg, false)
	var cursor int64
	if err := e.st.Pool().QueryRow(context.Background(), `SELECT max(cursor) FROM outbox_cursor`).Scan(&cursor); err != nil {
		t.Fatal(err)
	}
	if cursor >= lower.id {
		t.Fatalf("saved cursor %d at or above the open gap %d: the refused row %d would not be the new holder's first take in its inherited range (the test's premise)", cursor, lower.id, refused)
	}

	r2, logs2 := e.loggedRunner(cfg)
	e.run(r2)
	e.waitFor("the refused row delivered by the new holder", time.Minute, func() bool { return e.delivered(refused) })
	if n := logs2.Count(`"msg":"late commit"`); n != 0 {
		t.Fatalf("%d late commit lines before the commit:\n%s", n, logs2.Tail(20))
	}
	lower.commit(t)
	e.waitFor("the late row delivered", time.Minute, func() bool { return e.delivered(lower.id) })
	if n := logs2.Count(`"msg":"lock acquired"`); n != 1 {
		t.Fatalf("%d terms of the second runner, want one (the test's premise); last lines:\n%s", n, logs2.Tail(20))
	}
	expectLateCommit(t, logs2, r2, lower.id, higher)
}

// gapGivenUpBesideARefusedRow runs a first holder (cfg) that gives up a
// gap of aggregate A (lower, left in flight) and delivers A's higher row
// past it, while its sink refuses the one row of aggregate B (below higher
// when refusedBelow, else above it); it stops once its sent mark is saved
// past both, and leaves the receiver answering 2xx.
func (e *testBundle) gapGivenUpBesideARefusedRow(cfg testCfg, refusedBelow bool) (lower *racer, higher, refused int64) {
	e.t.Helper()
	e.rc.SetRespond(testkit.Statuses(map[string]int{"deal/B": 503}))
	r1, _ := e.loggedRunner(cfg)
	stop1 := e.run(r1)
	warm := e.produce("warm")
	e.waitFor("the first runner delivering", time.Minute, func() bool { return e.delivered(warm) })
	lower = e.race("A")
	if refusedBelow {
		refused = e.produce("B")
	}
	higher = e.produce("A")
	if !refusedBelow {
		refused = e.produce("B")
	}
	e.waitFor("the higher id delivered past gap_wait", time.Minute, func() bool { return e.delivered(higher) })
	e.waitFor("the sent mark saved", time.Minute, func() bool { return e.savedSent() >= max(higher, refused) })
	stop1()
	if e.delivered(refused) {
		e.t.Fatalf("premise: row %d of the refused aggregate was delivered by the first holder", refused)
	}
	e.rc.SetRespond(nil)
	return lower, higher, refused
}

// Rows the last holder took but never delivered (here its sink refused
// them; a crash leaves the same) lie at or below its sent mark, yet no
// later row of their aggregates went first: the new holder delivers them
// without a late commit.
func TestHandOverWithUndeliveredRowsIsNoLateCommit(t *testing.T) {
	e := setup(t)
	cfg := testConfig()
	cfg.LockTTL = 30 * time.Second
	e.rc.SetRespond(testkit.Statuses(map[string]int{"deal/B": 503}))
	r1, _ := e.loggedRunner(cfg)
	stop1 := e.run(r1)
	b1 := e.produce("A")
	stuck := []int64{e.produce("B"), e.produce("B")}
	b2 := e.produce("A")
	e.waitFor("the other aggregate delivered", time.Minute, func() bool { return e.delivered(b1) && e.delivered(b2) })
	e.waitFor("the sent mark past the refused rows", time.Minute, func() bool { return e.savedSent() >= b2 })
	stop1()
	if e.delivered(stuck[0]) || e.delivered(stuck[1]) {
		t.Fatal("a refused row was delivered")
	}

	e.rc.SetRespond(nil)
	r2, logs2 := e.loggedRunner(cfg)
	e.run(r2)
	e.waitFor("the refused rows delivered by the new holder", time.Minute, func() bool {
		return e.delivered(stuck[0]) && e.delivered(stuck[1])
	})
	if n := logs2.Count(`"msg":"late commit"`); n != 0 {
		t.Fatalf("%d late commit lines, want none:\n%s", n, logs2.Tail(20))
	}
	if n := testutil.ToFloat64(r2.m.LateCommits); n != 0 {
		t.Fatalf("outboxd_late_commits_total %v, want 0", n)
	}
}
