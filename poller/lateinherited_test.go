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
		return "late check" // store.LaterSent, store.InheritedLate
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
func (e *env) countStatements() *statementCounter {
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
// read: per read it walked (lowest row taken, mark], the rest of the backlog,
// and a 1M-row backlog drained at 3.9k ev/s against 39k for 100k rows
// (BENCHMARKS.md, session 5). The backlog cycles through as many aggregates
// as a batch holds, as the bench's does.
func TestBacklogDrainChecksInheritedRowsOnce(t *testing.T) {
	e := newEnv(t)
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
	e := newEnv(t)
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
