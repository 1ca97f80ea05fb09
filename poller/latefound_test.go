package poller

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxd/outboxd/internal/testkit"
	"github.com/outboxd/outboxd/store"
)

// takeIDWithoutXID opens a producer transaction that has taken its id
// (nextval) but has no transaction id yet, as a producer paused between
// taking its id and its first write: no snapshot can name it, so its gap
// looks ended at once and is dropped after lateWatch. nextval assigns an
// id itself when it logs the sequence (one call in 32): such a try is
// rolled back and taken again.
func (e *testBundle) takeIDWithoutXID() (pgx.Tx, int64) {
	e.t.Helper()
	ctx := context.Background()
	for range 64 {
		tx, err := e.st.Pool().Begin(ctx)
		if err != nil {
			e.t.Fatal(err)
		}
		var id int64
		var bare bool
		if err := tx.QueryRow(ctx, `SELECT nextval(pg_get_serial_sequence('outbox', 'id'))`).Scan(&id); err != nil {
			e.t.Fatal(err)
		}
		if err := tx.QueryRow(ctx, `SELECT pg_current_xact_id_if_assigned() IS NULL`).Scan(&bare); err != nil {
			e.t.Fatal(err)
		}
		if bare {
			e.t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
			return tx, id
		}
		_ = tx.Rollback(ctx)
	}
	e.t.Fatal("nextval assigned a transaction id 64 times in a row")
	return nil, 0
}

// dispatched says whether id's delivery is written in Postgres.
func (e *testBundle) dispatched(id int64) bool {
	return e.count("dispatched_at IS NOT NULL AND id = "+itoa(id)) == 1
}

// A row that becomes visible after its gap stopped being watched (its
// producer had no transaction id while the gap was seen, and wrote and
// committed after lateWatch) is found by the rescan below the cursor, not
// by the read's gap lookup. A later row of its aggregate went first: it is
// delivered with the WARN "late commit" and counted all the same: a late
// commit is never silent.
func TestLateCommitFoundByTheRescanIsWarned(t *testing.T) {
	e := setup(t)
	e.privatePostgres() // the gap must be seen ended: no other test's transaction in the snapshots
	cfg := testConfig()
	cfg.GapWait = 300 * time.Millisecond
	cfg.LockTTL = 30 * time.Second // one term (the test counts its warnings)
	r, logs := e.loggedRunner(cfg)
	r.rescanEvery = 500 * time.Millisecond
	e.run(r)
	warm := e.produce("warm")
	e.waitFor("the runner delivering", time.Minute, func() bool { return e.delivered(warm) })

	tx, lower := e.takeIDWithoutXID()
	higher := e.produce("A")
	logs.WaitLines(t, 20*time.Second, "the gap seen", 1, func(l string) bool {
		return strings.Contains(l, `"msg":"waiting for an earlier id"`) && strings.Contains(l, `"outbox_id":`+itoa(lower))
	})
	e.waitFor("the higher id delivered and written", time.Minute, func() bool { return e.delivered(higher) && e.dispatched(higher) })
	e.waitFor("the gap no longer watched (lateWatch passed)", time.Minute, func() bool { return r.gapRuns.Load() == 0 })

	ctx := context.Background()
	if _, err := tx.Exec(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
		OVERRIDING SYSTEM VALUE VALUES ($1, 'deal', 'A', 'deal.funded', '{}')`, lower); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	e.waitFor("the late row delivered", time.Minute, func() bool { return e.delivered(lower) })
	if n := logs.Count(`"msg":"lock acquired"`); n != 1 {
		t.Fatalf("%d terms, want one (the test's premise); last lines:\n%s", n, logs.Tail(20))
	}
	expectLateCommit(t, logs, r, lower, higher)
}

// A row whose producer was in flight when the first holder computed its
// cursor, below it, commits after that holder delivered a later row of its
// aggregate and handed over: the successor's cold pass (owed, saved with
// the cursor) finds it, below the cursor it loaded, where neither the gap
// watch nor the check of inherited rows looks. It is delivered with the
// WARN "late commit" and counted by the successor.
func TestLateCommitFoundBySuccessorsColdPassIsWarned(t *testing.T) {
	e := setup(t)
	// The cold pass waits for every transaction of the cluster open at the start.
	e.privatePostgres()
	lower := e.inFlightBelowTheComputedCursor("A") // open across both holders' starts
	cfg := testConfig()
	cfg.LockTTL = 30 * time.Second // one term per runner (the test counts them)
	a, logsA := e.loggedRunner(cfg)
	a.rescanEvery = time.Hour
	stopA := e.run(a)
	e.waitFor("the first holder's computed cursor saved", 20*time.Second, func() bool { return e.savedCursor() > lower.id })
	higher := e.produce("A")
	e.waitFor("the later row delivered and written by the first holder", 20*time.Second, func() bool {
		return e.delivered(higher) && e.dispatched(higher)
	})
	e.waitFor("the sent mark saved", 20*time.Second, func() bool { return e.savedSent() >= higher })
	stopA()
	if n := logsA.Count(`"msg":"late commit"`); n != 0 {
		t.Fatalf("the first holder warned %d times before the commit", n)
	}

	b, logsB := e.loggedRunner(cfg)
	b.rescanEvery = time.Hour
	e.run(b)
	logsB.WaitLine(t, 20*time.Second, `"msg":"read path starts"`)
	lower.commit(t)
	e.waitFor("the late row delivered by the successor's cold pass", 20*time.Second, func() bool { return e.delivered(lower.id) })
	if n := logsB.Count(`"msg":"lock acquired"`); n != 1 {
		t.Fatalf("%d terms of the successor, want one (the test's premise); last lines:\n%s", n, logsB.Tail(20))
	}
	expectLateCommit(t, logsB, b, lower.id, higher)
}

// lateWalkRunner starts a runner of one term (the tests count its
// warnings) whose rescan runs every 500 ms and whose late-commit walks wait
// at their start until release is called (at the test's end at the
// latest); walking gets a value as each walk starts, walked as each ends.
// It returns once the runner delivers.
func (e *testBundle) lateWalkRunner() (r *runner, logs *testkit.Logs, walking, walked <-chan struct{}, release func()) {
	e.privatePostgres() // a gap must be seen ended: no other test's transaction in the snapshots
	cfg := testConfig()
	cfg.GapWait = 300 * time.Millisecond
	cfg.LockTTL = 30 * time.Second
	r, logs = e.loggedRunner(cfg)
	r.rescanEvery = 500 * time.Millisecond
	start, end, held := make(chan struct{}, 8), make(chan struct{}, 8), make(chan struct{})
	r.hooks.lateWalk = func() {
		start <- struct{}{}
		<-held
	}
	r.hooks.lateWalked = func() { end <- struct{}{} }
	release = sync.OnceFunc(func() { close(held) })
	e.t.Cleanup(release)
	e.run(r)
	warm := e.produce("warm")
	e.waitFor("the runner delivering", time.Minute, func() bool { return e.delivered(warm) })
	return r, logs, start, end, release
}

// commitLate writes, in tx (takeIDWithoutXID), the row of aggregate deal/A
// at id, and commits.
func (e *testBundle) commitLate(tx pgx.Tx, id int64) {
	e.t.Helper()
	ctx := context.Background()
	if _, err := tx.Exec(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
		OVERRIDING SYSTEM VALUE VALUES ($1, 'deal', 'A', 'deal.funded', '{}')`, id); err != nil {
		e.t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		e.t.Fatal(err)
	}
}

// await waits a minute at most for c, or fails naming what.
func await(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(time.Minute):
		t.Fatalf("no %s within a minute", what)
	}
}

// The late-commit walk of a row found below the cursor (rescuedLate) runs
// off the lead: held, it holds up no batch, other aggregates' and the late
// row's own later rows go meanwhile; and the WARN, naming the later row
// sent before the late one, comes once the walk ends. Before, the lead
// walked every id from the row to the sent mark before sending anything
// (2.3 s behind 2M ids).
func TestLateCommitWalkHoldsNoBatch(t *testing.T) {
	e := setup(t)
	r, logs, walking, _, release := e.lateWalkRunner()
	tx, lower := e.takeIDWithoutXID()
	higher := e.produce("A")
	e.waitFor("the higher id delivered and written", time.Minute, func() bool { return e.delivered(higher) && e.dispatched(higher) })
	e.waitFor("the gap no longer watched (lateWatch passed)", time.Minute, func() bool { return r.gapRuns.Load() == 0 })
	e.commitLate(tx, lower)
	await(t, walking, "late-commit walk after the late row's commit")
	other, next := e.produce("B"), e.produce("A")
	e.waitFor("other rows delivered and written while the walk is held", time.Minute, func() bool {
		return e.delivered(lower) && e.dispatched(other) && e.dispatched(next)
	})
	if n := testutil.ToFloat64(r.m.LateCommits); n != 0 {
		t.Fatalf("outboxd_late_commits_total %v while the walk is held, want 0", n)
	}
	release()
	expectLateCommit(t, logs, r, lower, higher) // after_id: higher, not next (sent after lower)
}

// Two rows of one aggregate found below the cursor together, with no later
// row of theirs sent before them, are no late commit: the walk that checks
// the lower one runs once both are sent, but on the view taken at the
// claim, where the higher one was not yet dispatched. Walked as of its own
// start, it warned the lower "late commit after" the higher.
func TestLateCommitWalkSeesTheClaimsView(t *testing.T) {
	e := setup(t)
	r, logs, walking, walked, release := e.lateWalkRunner()
	tx1, lower1 := e.takeIDWithoutXID()
	tx2, lower2 := e.takeIDWithoutXID()
	above := e.produce("B")
	e.waitFor("the row above delivered and written", time.Minute, func() bool { return e.delivered(above) && e.dispatched(above) })
	e.waitFor("the gaps no longer watched (lateWatch passed)", time.Minute, func() bool { return r.gapRuns.Load() == 0 })
	e.commitLate(tx1, lower1)
	e.commitLate(tx2, lower2)
	await(t, walking, "late-commit walk after the rows' commit")
	e.waitFor("both rows delivered and written while the walk is held", time.Minute, func() bool {
		return e.dispatched(lower1) && e.dispatched(lower2)
	})
	release()
	await(t, walked, "end of the late-commit walk after its release")
	if n := logs.Count(`"msg":"late commit"`); n != 0 {
		t.Fatalf("%d late commit lines, want none (nothing of aggregate A was sent before %d and %d); last lines:\n%s", n, lower1, lower2, logs.Tail(20))
	}
	if n := testutil.ToFloat64(r.m.LateCommits); n != 0 {
		t.Fatalf("outboxd_late_commits_total %v, want 0", n)
	}
}

// Among rows taken from below the cursor, a row of an aggregate found there
// at or above its lowest id found, untried and not checked yet, is marked
// once a term; once claimed it is checked unless Redis holds it delivered
// or it is poisoned.
func TestFoundCheckMarksRescuedRowsOnce(t *testing.T) {
	t.Parallel()
	row := func(id int64, agg string, attempts int) store.Row {
		return store.Row{ID: id, AggregateType: "deal", AggregateID: agg, Attempts: attempts}
	}
	cases := []struct {
		name    string
		rows    []store.Row
		checked []int64 // already checked this term
		claimed map[int64]outcome
		want    []int64
	}{
		{name: "rescued row", rows: []store.Row{row(12, "A", 0)}, want: []int64{12}},
		{name: "below the lowest found", rows: []store.Row{row(9, "A", 0)}},
		{name: "above the cursor before the read", rows: []store.Row{row(60, "A", 0)}},
		{name: "another aggregate", rows: []store.Row{row(12, "B", 0)}},
		{name: "tried before", rows: []store.Row{row(12, "A", 1)}},
		{name: "checked already", rows: []store.Row{row(12, "A", 0)}, checked: []int64{12}},
		{name: "delivered in Redis", rows: []store.Row{row(12, "A", 0)}, claimed: map[int64]outcome{12: duplicate}},
		{name: "poisoned", rows: []store.Row{row(12, "A", 0)}, claimed: map[int64]outcome{12: poisoned}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var c foundCheck
			var checked checkedSet
			for _, id := range tc.checked {
				checked.mark(id)
			}
			c.note(store.Aggregate{Type: "deal", ID: "A"}, 10)
			c.rescued(tc.rows, 50, &checked)
			items := make([]item, len(tc.rows))
			for i, r := range tc.rows {
				items[i] = item{row: r, outcome: tc.claimed[r.ID]}
			}
			var got []int64
			for _, r := range c.claimed(items) {
				got = append(got, r.ID)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("checked once claimed %v, want %v", got, tc.want)
			}
			if again := c.claimed(items); len(again) != 0 {
				t.Errorf("claimed again: %d rows, want none (checked once)", len(again))
			}
		})
	}
}
