package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/migrations"
	"github.com/outboxd/outboxd/store"
)

// explainPooledRead is the read statement's plan (EXPLAIN, no costs) as q plans
// it, in a statement of its own or (tx) in a transaction of its own.
func explainPooledRead(t *testing.T, q interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}, tx bool) string {
	t.Helper()
	ctx := context.Background()
	args, _ := store.ReadArgs(store.FetchLimits{Rows: 100}, store.ReadPos{})
	run := func(q interface {
		Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	}) string {
		rows, err := q.Query(ctx, "EXPLAIN (COSTS OFF) "+store.ReadSQL, args...)
		if err != nil {
			t.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(lines, "\n")
	}
	if !tx {
		return run(q)
	}
	x, err := q.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = x.Rollback(ctx) }()
	return run(x)
}

// plainVia is a pool through b with no settings of outboxd's, in the
// protocol outboxd uses behind a transaction pooler.
func plainVia(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	cfg.MaxConns = 1
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// Behind a transaction pooler, with a role that has none of outboxd's
// settings, the read is planned as on a session of outboxd's own (its
// settings are startup parameters there), in a statement of its own and
// in a transaction; and the settings end with the transaction: the next
// client of the same server session has the server's.
func TestPooledStatementsArePlannedWithTheirSettings(t *testing.T) {
	direct, dsn := testenv.Store(t)
	var evs []store.Event
	for i := range 20 {
		evs = append(evs, ev("deal", "a", i))
	}
	enqueue(t, direct, evs...)
	// One server session: what one client leaves on it the next one sees.
	b := testenv.StartPgBouncer(t, dsn, "default_pool_size = 1")
	pooled := openVia(t, b.Via(dsn), store.WithTransactionPooler())
	plain := plainVia(t, b.Via(dsn))

	want := explainPooledRead(t, direct.Querier(), false)
	if bare := explainPooledRead(t, plain, false); bare == want {
		t.Fatalf("the read plans the same without outboxd's settings: the test cannot tell\n%s", want)
	}
	if got := explainPooledRead(t, pooled.Querier(), false); got != want {
		t.Errorf("the read behind the pooler plans\n%s\nwant (a session of its own)\n%s", got, want)
	}
	if got := explainPooledRead(t, pooled.Querier(), true); got != want {
		t.Errorf("the read in a transaction behind the pooler plans\n%s\nwant (a session of its own)\n%s", got, want)
	}
	var seqscan, cache string
	if err := plain.QueryRow(context.Background(), `SELECT current_setting('enable_seqscan'), current_setting('plan_cache_mode')`).
		Scan(&seqscan, &cache); err != nil {
		t.Fatal(err)
	}
	if seqscan != "on" || cache != "auto" {
		t.Errorf("after outboxd's transactions the server session has enable_seqscan = %s, plan_cache_mode = %s; want the server's (on, auto)", seqscan, cache)
	}
}

// With postgres.schema behind a transaction pooler and a role without a
// search_path, the fenced writes and the read work in outboxd's schema,
// never in the public one beside it.
func TestSchemaBehindATransactionPooler(t *testing.T) {
	direct, dsn := testenv.Store(t)
	ctx := context.Background()
	if _, err := migrations.Up(ctx, dsn, nil, migrations.WithSchema("relay_x")); err != nil {
		t.Fatal(err)
	}
	err := pgx.BeginFunc(ctx, direct.Pool(), func(tx pgx.Tx) error {
		return store.EnqueueIn(ctx, tx, "relay_x", ev("deal", "1", 1), ev("deal", "2", 2))
	})
	if err != nil {
		t.Fatal(err)
	}
	st := openVia(t, testenv.StartPgBouncer(t, dsn).Via(dsn), store.WithTransactionPooler(), store.WithSchema("relay_x"))
	if err := st.CheckSession(ctx); err != nil {
		t.Fatalf("check: %v", err)
	}
	f := store.Fence{Lock: "lock:outbox:poller", Token: 5, Owner: "a"}
	if err := st.ClaimFence(ctx, f); err != nil {
		t.Fatal(err)
	}
	res, err := st.ReadPath().Read(ctx, store.FetchLimits{Rows: 10}, store.ReadPos{})
	if err != nil || len(res.Rows) != 2 {
		t.Fatalf("read in relay_x: %d rows, %v; want 2", len(res.Rows), err)
	}
	var done []store.Delivered
	for _, r := range res.Rows {
		done = append(done, store.Delivered{ID: r.ID, CreatedAt: r.CreatedAt})
	}
	stale := store.Fence{Lock: f.Lock, Token: 3, Owner: "b"}
	if _, _, err := counts(st.ReadPath().Complete(ctx, stale, store.Outcomes{Delivered: done})); !errors.Is(err, store.ErrStaleFence) {
		t.Fatalf("complete with token 3 after 5: %v, want ErrStaleFence", err)
	}
	if n, _, err := counts(st.ReadPath().Complete(ctx, f, store.Outcomes{Delivered: done})); err != nil || n != 2 {
		t.Fatalf("complete: %d delivered, %v; want 2", n, err)
	}
	var dispatched, fences, public int
	err = direct.Pool().QueryRow(ctx, `SELECT (SELECT count(*) FROM relay_x.outbox WHERE dispatched_at IS NOT NULL),
		(SELECT count(*) FROM relay_x.outbox_fence WHERE token = 5), (SELECT count(*) FROM public.outbox_fence)`).
		Scan(&dispatched, &fences, &public)
	if err != nil {
		t.Fatal(err)
	}
	if dispatched != 2 || fences != 1 || public != 0 {
		t.Errorf("relay_x: %d delivered, %d fence rows at 5; public: %d fence rows; want 2, 1, 0", dispatched, fences, public)
	}
}
