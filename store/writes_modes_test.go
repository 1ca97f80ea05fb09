package store_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/store"
)

// Every write and read with a typed parameter means the same in every
// query exec mode a postgres.dsn can choose (default_query_exec_mode, e.g.
// simple_protocol behind a transaction pooler): a batch's failures get
// their backoff and dead_at, a dead row shows its payload and headers and
// is listed by its filters and replayed, a reconciliation run stores its
// summary, a purge deletes by age. A summary passed as bytes went as bytea
// in the exec and simple_protocol modes, and jsonb refused it.
func TestWritesMeanTheSameInEveryQueryExecMode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	relay := store.Fence{Lock: "lock:outbox:poller", Token: 1, Owner: "o"}
	rec := store.Fence{Lock: "lock:reconciliation", Token: 1, Owner: "o"}
	inEveryExecMode(t, func(i int, mode string, st *store.Store) {
		for _, f := range []store.Fence{relay, rec} {
			if err := st.ClaimFence(ctx, f); err != nil {
				t.Fatalf("%s: claim fence: %v", mode, err)
			}
		}
		e := ev(mode, "1", i)
		e.Headers = map[string]string{"traceparent": mode}
		enqueue(t, st, e, ev(mode, "2", 2), ev(mode, "3", 3), ev(mode, "4", 4))
		ids := rowsOf(t, st, mode)
		nd, nf, err := counts(st.ReadPath().Complete(ctx, relay, store.Outcomes{Delivered: done(t, st, ids[1]), Failures: []store.Failure{
			{ID: ids[0], Error: "400 " + mode, Dead: true},
			{ID: ids[2], Error: "503", Delay: time.Hour},
		}}))
		if err != nil || nd != 1 || nf != 2 {
			t.Fatalf("%s: Complete: delivered %d failed %d, %v; want 1, 2", mode, nd, nf, err)
		}
		var backoff bool
		if err := st.Pool().QueryRow(ctx, `SELECT available_at BETWEEN now() + interval '59 minutes' AND now() + interval '1 hour'
			FROM outbox WHERE id = $1`, ids[2]).Scan(&backoff); err != nil || !backoff {
			t.Fatalf("%s: a failure with a delay of an hour is not due in an hour (%v)", mode, err)
		}

		f := store.DeadFilter{AggregateType: mode, EventType: mode + ".*", Since: time.Now().Add(-24 * time.Hour), Error: "400"}
		page, err := st.Ops().ListDead(ctx, store.DeadQuery{Filter: f, After: nil, Limit: 10})
		if err != nil || len(page.Events) != 1 || page.Events[0].ID != ids[0] {
			t.Fatalf("%s: ListDead: %+v, %v; want row %d", mode, page, err, ids[0])
		}
		d, err := st.Ops().ShowDead(ctx, ids[0])
		if err != nil {
			t.Fatalf("%s: ShowDead: %v", mode, err)
		}
		var payload struct{ N int }
		var headers map[string]string
		if json.Unmarshal(d.Payload, &payload) != nil || payload.N != i || json.Unmarshal(d.Headers, &headers) != nil || headers["traceparent"] != mode {
			t.Fatalf("%s: ShowDead: payload %s headers %s", mode, d.Payload, d.Headers)
		}
		if n, err := st.Reconcile().ReplayDead(ctx, rec, store.Replay{Filter: f, BatchSize: 10, Progress: nil}); err != nil || n != 1 {
			t.Fatalf("%s: ReplayDead requeued %d, %v; want 1", mode, n, err)
		}
		if s := state(t, st, ids[0]); s.dead || s.attempts != 0 {
			t.Fatalf("%s: the replayed row: %+v", mode, s)
		}

		fire := time.Date(2026, 1, 1, 0, i, 0, 0, time.UTC)
		if ok, err := st.Reconcile().BeginRun(ctx, rec, fire); err != nil || !ok {
			t.Fatalf("%s: BeginRun: %v, %v", mode, ok, err)
		}
		if err := st.Reconcile().FinishRun(ctx, rec, store.Run{FireTime: fire, Summary: map[string]any{"mode": mode, "pending_by_attempts": map[int]int64{1: 2}}}); err != nil {
			t.Fatalf("%s: FinishRun: %v", mode, err)
		}
		var stored string
		if err := st.Pool().QueryRow(ctx, `SELECT summary->>'mode' FROM reconcile_runs WHERE fire_time = $1 AND finished_at IS NOT NULL`,
			fire).Scan(&stored); err != nil || stored != mode {
			t.Fatalf("%s: the run's summary: %q, %v", mode, stored, err)
		}

		if _, err := st.Pool().Exec(ctx, `UPDATE outbox SET dispatched_at = now() - interval '2 hours' WHERE id = $1`, ids[1]); err != nil {
			t.Fatal(err)
		}
		if n, _, err := purgedOf(st.Reconcile().Purge(ctx, rec, store.PurgeBatch{Kind: store.PurgeDelivered, Age: time.Hour, After: store.PurgeCursor{}, Limit: 10})); err != nil || n != 1 {
			t.Fatalf("%s: Purge deleted %d, %v; want the row delivered 2 hours ago", mode, n, err)
		}
	})
}

// inEveryExecMode runs f with a store on one database (the test's) in each
// query exec mode pgx offers, in turn; i counts the modes from 0.
func inEveryExecMode(t *testing.T, f func(i int, mode string, st *store.Store)) {
	t.Helper()
	_, dsn := testenv.Store(t)
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	for i, mode := range []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"} {
		st, err := store.Open(context.Background(), dsn+sep+"default_query_exec_mode="+mode)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.Close)
		f(i, mode, st)
	}
}

// rowsOf is the ids of aggregate type typ's rows, in id order.
func rowsOf(t *testing.T, st *store.Store, typ string) []int64 {
	t.Helper()
	rows, err := st.Pool().Query(context.Background(), `SELECT id FROM outbox WHERE aggregate_type = $1 ORDER BY id`, typ)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}
