package poller

import (
	"context"
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
		return "late check" // store.LaterSent, store.DispatchedAbove
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
	counter := &statementCounter{calls: map[string]int{}, rows: map[string]int64{}}
	pc, err := pgxpool.ParseConfig(e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.Tracer = counter
	st, err := store.OpenConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	e.st = st
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
