package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/store"
)

// hotStatement is one statement a running relay issues per read, batch or
// scrape, as pgx prepared it: found in pg_prepared_statements by a piece of
// its text, measured by EXPLAIN (ANALYZE, BUFFERS) EXECUTE of that
// prepared statement, so the plan measured is the one the relay's session
// cached.
type hotStatement struct {
	name  string // as the failure message says it
	match string // a piece of the SQL text that names it among the session's statements
	args  func(p *planProbe) []any
}

// perTermPer1k bounds how much a once-a-term statement's buffers may grow
// per 1,000 rows of history: InheritedLate's generic plan reads
// outbox_pending_aggregate_idx's pages (about 5.5 per 1,000 rows a held
// snapshot keeps); a walk of the rows themselves costs 1,000 or more.
const perTermPer1k = 10

// planProbe is where one probe stands: a batch of rows pending above the
// cursor, as the relay sees it in a drain.
type planProbe struct {
	fence  store.Fence
	epoch  string
	cursor int64 // every id at or below is delivered
	rows   []store.Row
}

// planCost is what one execution did, counted, not timed.
type planCost struct {
	buffers int64 // shared blocks hit + read, the whole plan's
	// rows is every row a plan node produced or threw away (filters, join
	// filters, rechecks), summed over its loops: a quadratic join (an inner
	// scan repeated per outer row) shows here even when it touches no
	// buffer.
	rows int64
	plan string // the nodes, one a line, for the failure message
	root costNode
	// memory is the kB its hash tables took at their peak (hash
	// aggregates, hash joins), summed over the plan's nodes: Postgres
	// sizes a hash table from the rows the plan expects, so it is paid
	// per execution even when no row comes (a read that found nothing
	// built 3 MB for the 99k rows an ANALYZE of the history led it to
	// expect, and took 0.2 ms more, per read, for that alone).
	memory int64
}

// The relay's hot statements keep the plans they get on a small table: a
// cost that does not grow with history, and that grows with the batch at
// most linearly.
//
// Why this is what the relay runs: its sessions set plan_cache_mode =
// force_generic_plan (store.OpenConfig), and pgx prepares each statement on
// its first use in a session (QueryExecModeCacheStatement, the default), so
// each session plans each statement once, at its first execution: on a new
// relay, a small table. That plan is kept while the table grows, until an
// ANALYZE or DDL invalidates it (autovacuum is off on the CI machines and
// may be off or slow in production). With plan_cache_mode = auto (an
// operator's DSN) Postgres switches to the generic plan made then from the
// sixth execution when it does not price it above the custom ones (here
// six of the eight statements did; the read and the batch write stayed
// custom). So the test drives the real Store methods through a
// one-connection pool six times on a small table (their statements
// prepared by pgx, plans made), checks with pg_prepared_statements that
// the plans are generic (force_generic_plan; auto measures what Postgres
// chose), then grows the table under a held snapshot and runs EXPLAIN
// (ANALYZE, BUFFERS) EXECUTE of those same prepared statements: behind
// 20k and 200k rows, each with a batch of 1,000 rows pending. Then once
// more after ANALYZE saw the history (autovacuum, where it is on): the
// plans made again from those statistics, behind 220k and 400k rows.
//
// TestHotPathCostDoesNotGrowWithHistory runs one row per batch and counts
// buffers only: a generic plan that rescans the batch's unnest() once per
// row compares hundreds of thousands of rows per batch of 1,000 with no
// more buffers, and slows a drain several times. This test counts plan
// rows too, with full batches.
func TestHotPathPlansMadeOnASmallTableStayFlat(t *testing.T) {
	t.Parallel()
	// force_generic_plan is the relay's own setting; auto is what an
	// operator gets who sets plan_cache_mode in the DSN.
	for _, mode := range []string{"force_generic_plan", "auto"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			hotPathPlans(t, mode)
		})
	}
}

func hotPathPlans(t *testing.T, planCacheMode string) {
	setup, dsn := testenv.Store(t) // producers, history, the held snapshot
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1 // one session: every statement prepared and planned there
	cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = planCacheMode
	relay, err := store.OpenConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	fence := store.Fence{Lock: "lock:outbox:poller", Token: 1, Owner: "a"}
	if err := relay.ClaimFence(ctx, fence); err != nil {
		t.Fatal(err)
	}

	const batch = 1000
	statements := []hotStatement{
		{"the read (Read, readSQL)", "WITH snap AS MATERIALIZED", func(p *planProbe) []any {
			args, _ := store.ReadArgs(store.FetchLimits{Rows: batch, RowBytes: 1 << 20, Bytes: 64 << 20},
				store.ReadPos{Cursor: p.cursor, Frontier: p.cursor, Watch: []int64{p.cursor - 5}, Holding: []store.Gap{{ID: p.cursor - 7, Horizon: 1}}})
			return args
		}},
		{"the batch's delivery and failure write (Complete, completeSQL)", "async AS (SELECT set_config('synchronous_commit', 'off', true))", func(p *planProbe) []any {
			// 990 delivered, 10 failed (retried in an hour), as one write.
			var ids, fids []int64
			var created, fcreated []time.Time
			var retry []int64 // microseconds
			var errs []string
			var dead []bool
			for i, r := range p.rows {
				if i%100 == 99 {
					fids, errs, retry, dead = append(fids, r.ID), append(errs, "503"), append(retry, time.Hour.Microseconds()), append(dead, false)
					fcreated = append(fcreated, r.CreatedAt)
					continue
				}
				ids, created = append(ids, r.ID), append(created, r.CreatedAt)
			}
			kinds, ms := make([]string, len(fids)), make([]int64, len(fids)) // the attempt history's
			for i := range fids {
				kinds[i], ms[i] = "http_503", 20
			}
			return []any{p.fence.Lock, p.fence.Token, p.fence.Owner, ids, fids, errs, retry, dead, created, fcreated, kinds, ms}
		}},
		{"the cursor save (SaveCursor)", "INSERT INTO outbox_cursor", func(p *planProbe) []any {
			top := p.rows[len(p.rows)-1].ID
			return []any{p.fence.Lock, p.fence.Token, p.fence.Owner, top, p.epoch, top, int64(0)}
		}},
		{"the late-commit check (LaterSent)", "WHERE o.id > $4 AND o.id <= $5 AND o.dispatched_at IS NOT NULL", func(p *planProbe) []any {
			// A new holder's rows at or below its predecessors' sent mark.
			ids, types, aggs := make([]int64, len(p.rows)), make([]string, len(p.rows)), make([]string, len(p.rows))
			for i, r := range p.rows {
				ids[i], types[i], aggs[i] = r.ID, r.AggregateType, r.AggregateID
			}
			return []any{ids, types, aggs, p.rows[0].ID, p.rows[len(p.rows)-1].ID + 1}
		}},
		{"the inherited rows' check (InheritedLate, once a term)", "reach AS (SELECT COALESCE(max(top)", func(p *planProbe) []any {
			// What earlier holders dispatched in the last batch below the cursor.
			return []any{p.cursor - batch, p.cursor, 10_000 + 1}
		}},
		{"the rescan step (PendingBetween)", "available_at <= created_at AND id > $1 AND id <= $2", func(p *planProbe) []any {
			return []any{p.cursor - 10*batch, p.cursor}
		}},
		{"the saved cursor's load (LoadCursor)", "SELECT COALESCE(saved.cursor", func(p *planProbe) []any {
			return []any{p.fence.Lock, int64(10_000), nil} // floor: none needed, a cursor is saved
		}},
		{"the backlog gauges (Stats, each scrape)", "above AS MATERIALIZED", func(*planProbe) []any { return []any{nil} }}, // floor: as LoadCursor
	}

	// The settings a statement runs under in its transaction, as the store
	// runs it: a plan made again after ANALYZE is made under them.
	settings := map[string][]string{"the backlog gauges (Stats, each scrape)": store.StatsSettings}

	// Plans made on a small table: 20 rows, each method run six times.
	enqueueRows(t, setup, 20)
	_, _, _, epoch, err := cursorOf(relay.ReadPath().LoadCursor(ctx, fence.Lock))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		res, err := relay.ReadPath().Read(ctx, store.FetchLimits{Rows: 10}, store.ReadPos{Cursor: 0, Watch: []int64{1}})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Rows) < 2 {
			t.Fatalf("read %d: %d rows, want at least 2", i, len(res.Rows))
		}
		a, b := res.Rows[0], res.Rows[1]
		if _, _, err := counts(relay.ReadPath().Complete(ctx, fence, store.Outcomes{Delivered: []store.Delivered{{ID: a.ID, CreatedAt: a.CreatedAt}}, Failures: []store.Failure{{ID: b.ID, Error: "x", Delay: 0}}})); err != nil {
			t.Fatal(err)
		}
		if err := relay.ReadPath().SaveCursor(ctx, fence, store.Cursor{At: 0, Sent: a.ID, Epoch: epoch}); err != nil {
			t.Fatal(err)
		}
		if _, err := relay.ReadPath().LaterSent(ctx, res.Rows, 20); err != nil {
			t.Fatal(err)
		}
		if _, _, err := lateOf(relay.ReadPath().InheritedLate(ctx, store.InheritedRange{Lo: 0, Hi: 20, Limit: 100})); err != nil {
			t.Fatal(err)
		}
		if _, err := relay.ReadPath().PendingBetween(ctx, 0, 20); err != nil {
			t.Fatal(err)
		}
		if _, _, _, _, err := cursorOf(relay.ReadPath().LoadCursor(ctx, fence.Lock)); err != nil {
			t.Fatal(err)
		}
		if _, err := relay.Ops().Stats(ctx); err != nil {
			t.Fatal(err)
		}
	}
	conn, err := relay.Pool().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	prepared := preparedStatements(t, conn, statements, planCacheMode == "force_generic_plan")
	conn.Release()

	// A report's snapshot, held while the history is written and delivered.
	holdSnapshot(t, setup)
	measure := func(history int) []planCost {
		t.Helper()
		grow := history - int(maxID(t, setup))
		exec(t, setup, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
			SELECT 'deal', (i % 1000)::text, 'deal.happened', '{}' FROM generate_series(1, $1::int) i`, max(grow, 0))
		exec(t, setup, `UPDATE outbox SET dispatched_at = now() WHERE dispatched_at IS NULL`)
		p := &planProbe{fence: fence, epoch: epoch, cursor: maxID(t, setup)}
		if err := relay.ReadPath().SaveCursor(ctx, fence, store.Cursor{At: p.cursor, Sent: p.cursor, Epoch: epoch}); err != nil {
			t.Fatal(err)
		}
		// Two settled rows back off again below the cursor, of aggregates
		// of their own: one due (the read takes it through the backoff
		// index), one not (so the read asks, per row, whether an earlier
		// row of its aggregate backs off).
		exec(t, setup, `UPDATE outbox SET dispatched_at = NULL, attempts = 1, aggregate_id = 'retry-' || id,
			available_at = CASE WHEN id = $1::bigint THEN now() + interval '1 hour' ELSE created_at + interval '1 microsecond' END
			WHERE id IN ($1::bigint, $1::bigint - 1)`, p.cursor)
		enqueueRows(t, setup, batch)
		res, err := relay.ReadPath().Read(ctx, store.FetchLimits{Rows: batch}, store.ReadPos{Cursor: p.cursor, Frontier: p.cursor})
		if err != nil {
			t.Fatal(err)
		}
		if p.rows = res.Rows; len(p.rows) != batch {
			t.Fatalf("behind %d rows: read %d rows, want %d", history, len(p.rows), batch)
		}
		conn, err := relay.Pool().Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
		costs := make([]planCost, len(statements))
		for i, s := range statements {
			// Twice: a first run in a session also pays catalog lookups.
			explainCost(t, conn, settings[s.name], prepared[i], s.args(p))
			costs[i] = explainCost(t, conn, settings[s.name], prepared[i], s.args(p))
		}
		return costs
	}
	near := measure(20_000)
	far := measure(200_000)
	// The plans made again once ANALYZE saw the history (nothing pending,
	// as when autovacuum runs while the relay is caught up), then kept
	// while the history doubles.
	// A sample as large as the table: the same statistics, and so the same
	// plans, in every run (a sample of 30k rows flipped the plans).
	if err := pgx.BeginFunc(ctx, setup.Pool(), func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL default_statistics_target = 10000`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `ANALYZE outbox`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	analyzed := measure(220_000)
	analyzedFar := measure(400_000)
	for i, s := range statements {
		t.Logf("%s, a batch of %d: behind 20k → 200k rows delivered under a held snapshot: %d → %d buffers, %d → %d plan rows; analyzed, behind 220k → 400k: %d → %d buffers, %d → %d plan rows; hash tables: small-table plan %d kB, analyzed %d kB",
			s.name, batch, near[i].buffers, far[i].buffers, near[i].rows, far[i].rows,
			analyzed[i].buffers, analyzedFar[i].buffers, analyzed[i].rows, analyzedFar[i].rows, near[i].memory, analyzedFar[i].memory)
		for _, c := range []struct {
			when         string
			before, then planCost
			grown        int64 // rows of history added between the two
		}{{"the plan made on a small table, behind 20k and 200k rows", near[i], far[i], 180_000},
			{"the plan made after ANALYZE, behind 220k and 400k rows", analyzed[i], analyzedFar[i], 180_000}} {
			n, f := c.before, c.then
			allowed := n.buffers + n.buffers/2 + 10
			// Once a term (named so), not per read: its buffers may grow
			// by perTermPer1k per 1,000 rows of history (index pages).
			if strings.Contains(s.name, "once a term") {
				allowed = n.buffers + perTermPer1k*c.grown/1000
			}
			if f.buffers > allowed {
				t.Errorf("%s (%s): %d and %d buffers: it walks the history\n%s", s.name, c.when, n.buffers, f.buffers, f.plan)
			}
			if f.rows > n.rows+n.rows/2+10 {
				t.Errorf("%s (%s): its plan nodes handled %d and %d rows: it walks the history\n%s", s.name, c.when, n.rows, f.rows, f.plan)
			}
			// Linear in the batch: a plan that compares each row of the
			// batch with each other (a rescan per row) handles ~batch²/2
			// rows; one that scans a range per row touches its buffers
			// per row.
			for _, x := range []planCost{n, f} {
				if bound := int64(perBatchRow * batch); x.rows > bound || x.buffers > bound {
					t.Errorf("%s (%s): %d plan rows and %d buffers for a batch of %d, want at most %d each (%d per row of the batch): its work grows faster than the batch\n%s",
						s.name, c.when, x.rows, x.buffers, batch, bound, perBatchRow, x.plan)
					break
				}
			}
		}
		// Its hash tables are sized by the rows it handles, not by the
		// table's statistics: a plan made after ANALYZE saw the history
		// takes no more memory per execution than one made on a small
		// table. (Once a term, its hash tables hold the rows it handles:
		// InheritedLate groups a batch's aggregates.)
		if strings.Contains(s.name, "once a term") {
			continue
		}
		for _, x := range []planCost{analyzed[i], analyzedFar[i]} {
			if x.memory > near[i].memory+near[i].memory/2+64 {
				t.Errorf("%s: the plan made after ANALYZE of the history built %d kB of hash tables, the plan made on a small table %d kB: it sizes them from the statistics, not the rows\n%s",
					s.name, x.memory, near[i].memory, x.plan)
				break
			}
		}
	}
}

// perBatchRow bounds the plan rows and the buffers a hot statement handles
// per row of a batch of 1,000. The largest are the read's plan rows and
// the batch write's buffers (each delivered row gets new index entries),
// well below it; a plan that rescans the batch once per row handles about
// a thousand plan rows per row.
const perBatchRow = 30

// enqueueRows writes n pending rows in one statement, spread over 100
// aggregates.
func enqueueRows(t *testing.T, st *store.Store, n int) {
	t.Helper()
	exec(t, st, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'deal', (i % 100)::text, 'deal.happened', '{}' FROM generate_series(1, $1::int) i`, n)
}

// preparedStatements finds each statement among those pgx prepared on
// conn, and fails unless Postgres ran it six times or more, with generic
// plans only when forced.
func preparedStatements(t *testing.T, conn *pgxpool.Conn, statements []hotStatement, forced bool) []string {
	t.Helper()
	out := make([]string, len(statements))
	for i, s := range statements {
		var name string
		var params int
		var generic, custom int64
		err := conn.QueryRow(context.Background(), `SELECT name, cardinality(parameter_types), generic_plans, custom_plans
			FROM pg_prepared_statements WHERE strpos(statement, $1) > 0`, s.match).Scan(&name, &params, &generic, &custom)
		if err != nil {
			t.Fatalf("%s: no single statement prepared by the relay's session holds %q: %v", s.name, s.match, err)
		}
		if forced && (generic == 0 || custom > 0) {
			t.Fatalf("%s: %d generic and %d custom plans, want generic plans only (store.OpenConfig's plan_cache_mode)", s.name, generic, custom)
		}
		if generic+custom < 6 {
			t.Fatalf("%s: planned %d times, want 6 or more (auto switches to a generic plan from the sixth)", s.name, generic+custom)
		}
		t.Logf("%s: %d generic, %d custom plans on the small table", s.name, generic, custom)
		ph := make([]string, params)
		for j := range ph {
			ph[j] = "$" + strconv.Itoa(j+1)
		}
		out[i] = fmt.Sprintf("EXECUTE %s(%s)", pgIdent(name), strings.Join(ph, ", "))
		if params == 0 {
			out[i] = "EXECUTE " + pgIdent(name)
		}
	}
	return out
}

func pgIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// oneSession opens a store on dsn whose pool holds one session with the
// runtime parameters params, closed at cleanup: what it prepares is
// planned there, where a test can EXPLAIN the prepared statement.
func oneSession(t *testing.T, dsn string, params map[string]string) *store.Store {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	maps.Copy(cfg.ConnConfig.RuntimeParams, params)
	st, err := store.OpenConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st
}

// explainCost runs EXPLAIN (ANALYZE, BUFFERS) of execute (rolled back) and
// counts its buffers and plan rows.
func explainCost(t *testing.T, conn *pgxpool.Conn, settings []string, execute string, args []any) planCost {
	t.Helper()
	raw := explainUndoneJSONWith(t, conn, settings, execute, args...)
	var plans []struct {
		Plan costNode `json:"Plan"`
	}
	if err := json.Unmarshal(raw, &plans); err != nil || len(plans) != 1 {
		t.Fatalf("explain: %v %s", err, raw)
	}
	var plan strings.Builder
	plans[0].Plan.render(&plan, "  ")
	return planCost{buffers: plans[0].Plan.Hit + plans[0].Plan.Read, rows: plans[0].Plan.work(), memory: plans[0].Plan.memory(), plan: plan.String(), root: plans[0].Plan}
}

type costNode struct {
	Type       string     `json:"Node Type"`
	Index      string     `json:"Index Name"`
	Relation   string     `json:"Relation Name"`
	Alias      string     `json:"Alias"`
	CTE        string     `json:"CTE Name"`
	Subplan    string     `json:"Subplan Name"`
	Hit        int64      `json:"Shared Hit Blocks"`
	Read       int64      `json:"Shared Read Blocks"`
	Rows       float64    `json:"Actual Rows"`
	Loops      float64    `json:"Actual Loops"`
	Filtered   float64    `json:"Rows Removed by Filter"`
	JoinFilter float64    `json:"Rows Removed by Join Filter"`
	Rechecked  float64    `json:"Rows Removed by Index Recheck"`
	PeakMemory int64      `json:"Peak Memory Usage"` // kB: HashAggregate and Hash nodes, EXPLAIN ANALYZE
	Children   []costNode `json:"Plans"`
}

// work sums the rows each node produced or removed over all its loops
// (EXPLAIN reports them per loop).
func (n costNode) work() int64 {
	w := int64((n.Rows + n.Filtered + n.JoinFilter + n.Rechecked) * n.Loops)
	for _, c := range n.Children {
		w += c.work()
	}
	return w
}

// memory sums the hash tables' peak memory (kB) of n and the nodes under it.
func (n costNode) memory() int64 {
	m := n.PeakMemory
	for _, c := range n.Children {
		m += c.memory()
	}
	return m
}

// find returns the first node (depth first) named subplan, nil if none.
func (n *costNode) find(subplan string) *costNode {
	if n.Subplan == subplan {
		return n
	}
	for i := range n.Children {
		if f := n.Children[i].find(subplan); f != nil {
			return f
		}
	}
	return nil
}

// ran says whether a node of type typ under n (n included) was executed.
func (n *costNode) ran(typ string) bool {
	if n.Type == typ && n.Loops > 0 {
		return true
	}
	for i := range n.Children {
		if n.Children[i].ran(typ) {
			return true
		}
	}
	return false
}

// scans counts the CTE Scans of cte under n (n included) that ran.
func (n *costNode) scans(cte string) int {
	k := 0
	if n.Type == "CTE Scan" && n.CTE == cte && n.Loops > 0 {
		k++
	}
	for i := range n.Children {
		k += n.Children[i].scans(cte)
	}
	return k
}

// render writes the node and its children, one a line: what ran, on what,
// its rows over all loops and its buffers.
func (n costNode) render(b *strings.Builder, indent string) {
	fmt.Fprintf(b, "%s%s", indent, n.Type)
	if n.Index != "" {
		fmt.Fprintf(b, " using %s", n.Index)
	}
	if n.Relation != "" || n.Alias != "" {
		fmt.Fprintf(b, " on %s %s", n.Relation, n.Alias)
	}
	fmt.Fprintf(b, ": %.0f rows × %.0f loops, %.0f removed, %d buffers", n.Rows, n.Loops, n.Filtered+n.JoinFilter+n.Rechecked, n.Hit+n.Read)
	if n.PeakMemory > 0 {
		fmt.Fprintf(b, ", %d kB", n.PeakMemory)
	}
	b.WriteString("\n")
	for _, c := range n.Children {
		c.render(b, indent+"  ")
	}
}
