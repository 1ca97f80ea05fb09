package reconcile

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/outboxd/outboxd/internal/keys"
	"github.com/outboxd/outboxd/internal/metrics"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/internal/testkit"
	"github.com/outboxd/outboxd/lock/redislease"
	"github.com/outboxd/outboxd/store"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// testBundle is what every test starts with: its own database and Redis
// key prefix.
type testBundle struct {
	t      *testing.T
	st     *store.Store
	rdb    *redis.Client
	prefix string
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	st, _ := testenv.Store(t)
	rdb, prefix := testenv.Redis(t)
	return &testBundle{t: t, st: st, rdb: rdb, prefix: prefix}
}

type rec struct {
	*Reconciler
	m *metrics.Metrics
}

func (e *testBundle) reconciler(cfg Config) *rec {
	e.t.Helper()
	cfg.KeyPrefix = e.prefix
	if cfg.Schedule == "" {
		cfg.Schedule = "@every 1s"
	}
	if cfg.Retention == 0 {
		cfg.Retention = time.Hour
	}
	m := metrics.New()
	locks := redislease.New([]redis.UniversalClient{e.rdb}, redislease.WithKeyPrefix(e.prefix))
	r, err := New(cfg, Deps{Store: e.st, Locks: locks, Redis: e.rdb, Log: testkit.Logger(e.t), Metrics: m})
	if err != nil {
		e.t.Fatal(err)
	}
	return &rec{r, m}
}

func (e *testBundle) exec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.st.Pool().Exec(context.Background(), sql, args...); err != nil {
		e.t.Fatal(err)
	}
}

func (e *testBundle) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.st.Pool().QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// insertPending adds n pending rows and returns their ids.
func (e *testBundle) insertPending(n int) []int64 {
	e.t.Helper()
	rows, err := e.st.Pool().Query(context.Background(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'deal', (i % 7)::text, 'deal.funded', '{}' FROM generate_series(1, $1) i RETURNING id`, n)
	if err != nil {
		e.t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		e.t.Fatal(err)
	}
	return ids
}

// markKeyDelivered sets a pending row's key to its own delivered mark, as
// the poller leaves it when it crashed before marking Postgres.
func (e *testBundle) markKeyDelivered(id int64) {
	e.t.Helper()
	e.setKey(id, keys.Delivered(e.fingerprint(id)), keys.DeliveredTTL)
}

func (e *testBundle) setKey(id int64, v string, ttl time.Duration) {
	e.t.Helper()
	if err := e.rdb.Set(context.Background(), e.prefix+"idempotency:notify:"+strconv.FormatInt(id, 10), v, ttl).Err(); err != nil {
		e.t.Fatal(err)
	}
}

// fingerprint is row id's keys.Fingerprint, its content taken in Go from
// the payload and headers as a read returns them (as the poller does).
func (e *testBundle) fingerprint(id int64) string {
	e.t.Helper()
	var at time.Time
	var typ, agg, ev string
	var payload, headers []byte
	if err := e.st.Pool().QueryRow(context.Background(), `SELECT created_at, aggregate_type, aggregate_id, event_type, payload, headers
		FROM outbox WHERE id = $1`, id).Scan(&at, &typ, &agg, &ev, &payload, &headers); err != nil {
		e.t.Fatal(err)
	}
	return keys.Fingerprint(at, typ, agg, ev, keys.ContentOf(payload, headers))
}

// The repair sweep computes the fingerprint the poller does: the poller
// takes the payload and headers digest in Go from the bytes it read, the
// sweep in Postgres (store.Reconcile.ContentDigests); every row whose key holds the
// mark made the poller's way is marked, whatever its JSON holds.
func TestMarkSweepComputesThePollersFingerprint(t *testing.T) {
	t.Parallel()
	e := setup(t)
	docs := []struct{ payload, headers string }{
		{`{}`, `{}`},
		{`{"b": 1, "a": [1, 2.50, -0.0, 1e400], "n": null}`, `{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`},
		{`{"ü": "\u00fc \" \\ \n \t é 日本 😀"}`, `{"x": {"y": [true, false]}}`},
		{`"a string"`, `{"k": "v"}`},
		{`[1, "two", {"three": 3}]`, `{}`},
		{`12345678901234567890.123456789`, `{"a": "b", "aa": "bb"}`},
		{`{"big": "` + strings.Repeat("xyz", 100000) + `"}`, `{}`},
	}
	var ids []int64
	for _, d := range docs {
		var id int64
		if err := e.st.Pool().QueryRow(context.Background(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
			VALUES ('deal', 'j', 'deal.funded', $1::jsonb, $2::jsonb) RETURNING id`, d.payload, d.headers).Scan(&id); err != nil {
			t.Fatalf("insert %.60s: %v", d.payload, err)
		}
		ids = append(ids, id)
		e.markKeyDelivered(id)
	}
	sum, err := e.reconciler(Config{}).RunOnce(context.Background(), time.Now(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if sum.MarkedFromRedis != int64(len(ids)) {
		t.Errorf("marked %d of %d rows holding their own marks", sum.MarkedFromRedis, len(ids))
	}
	for i, id := range ids {
		if e.count(`SELECT count(*) FROM outbox WHERE id = $1 AND dispatched_at IS NOT NULL`, id) != 1 {
			t.Errorf("row %d (%.60s / %s) not marked: the sweep's fingerprint differs from the poller's", id, docs[i].payload, docs[i].headers)
		}
	}
}

// A row written again with the id, created_at and names of a delivered
// one but another payload or other headers (a producer that sets
// created_at itself, re-importing after a rewind) is another row: the
// sweep does not mark it from the earlier row's mark.
func TestMarkSweepTakesAnotherPayloadForAnotherRow(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ids := e.insertPending(3)
	for _, id := range ids {
		e.markKeyDelivered(id) // the marks of the rows as first written
	}
	e.exec(`UPDATE outbox SET payload = '{"v": 2}' WHERE id = $1`, ids[0])
	e.exec(`UPDATE outbox SET headers = '{"traceparent": "00-abc"}' WHERE id = $1`, ids[1])
	sum, err := e.reconciler(Config{}).RunOnce(context.Background(), time.Now(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{false, false, true} {
		if got := e.count(`SELECT count(*) FROM outbox WHERE id = $1 AND dispatched_at IS NOT NULL`, ids[i]) == 1; got != want {
			t.Errorf("row %d (case %d): marked %v, want %v", ids[i], i, got, want)
		}
	}
	if sum.MarkedFromRedis != 1 {
		t.Errorf("marked %d, want 1 (the row as it was written)", sum.MarkedFromRedis)
	}
}

// Three replicas with skewed starts: every fire time in the window runs
// exactly once.
func TestEachFireTimeRunsOnceAcrossReplicas(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var recs []*rec
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	start := time.Now()
	for i := range 3 {
		r := e.reconciler(Config{Schedule: "@every 1s", LockTTL: 5 * time.Second, LockWait: 300 * time.Millisecond})
		recs = append(recs, r)
		time.Sleep(time.Duration(i) * 330 * time.Millisecond) // skewed start
		wg.Go(func() { _ = r.Run(ctx) })
	}
	time.Sleep(10*time.Second - time.Since(start))
	cancel()
	wg.Wait()

	var ok, skipped float64
	for _, r := range recs {
		ok += testutil.ToFloat64(r.m.ReconcileRuns.WithLabelValues("ok"))
		skipped += testutil.ToFloat64(r.m.ReconcileRuns.WithLabelValues("skipped"))
		if f := testutil.ToFloat64(r.m.ReconcileRuns.WithLabelValues("failed")); f != 0 {
			t.Fatalf("%v failed runs", f)
		}
	}
	rows := e.count(`SELECT count(*) FROM reconcile_runs`)
	distinct := e.count(`SELECT count(DISTINCT fire_time) FROM reconcile_runs`)
	span := e.count(`SELECT extract(epoch FROM max(fire_time) - min(fire_time))::int + 1 FROM reconcile_runs`)
	unfinished := e.count(`SELECT count(*) FROM reconcile_runs WHERE finished_at IS NULL`)
	t.Logf("runs ok %v, skipped %v, fire times %d over %ds", ok, skipped, rows, span)
	// The guarantee is "never twice"; a fire time all replicas missed (a
	// holder slower than the schedule on a loaded machine) is allowed, so
	// the count of runs is only checked to show the schedule was exercised.
	if rows < 3 || rows != distinct {
		t.Fatalf("%d runs for %d distinct fire times over %d seconds: want several, none twice", rows, distinct, span)
	}
	if int(ok) != rows || unfinished != 0 {
		t.Fatalf("%v successful runs for %d fire times (%d unfinished)", ok, rows, unfinished)
	}
	if skipped == 0 {
		t.Fatalf("no replica ever skipped a fire time another ran (%d fire times)", rows)
	}
}

// A sweep longer than 3 TTLs keeps its lock (watchdog) and finishes. The
// lease is 5 s, as in lock's TestWatchdogKeepsLockPastThreeTTLs: renewals
// every TTL/3 give each Redis call TTL/10, so with a 1 s lease a loaded
// machine whose Redis answers slower than 100 ms for a moment loses it.
func TestWatchdogKeepsLongSweepAlive(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ids := e.insertPending(3)
	e.markKeyDelivered(ids[0])
	ttl := 5 * time.Second
	r := e.reconciler(Config{LockTTL: ttl})
	r.hooks.beforeMark = func(ctx context.Context) {
		select {
		case <-ctx.Done():
		case <-time.After(3 * ttl):
		}
	}
	sum, err := r.RunOnce(context.Background(), time.Now(), time.Second)
	if err != nil {
		t.Fatalf("long sweep: %v", err)
	}
	if sum.MarkedFromRedis != 1 {
		t.Fatalf("marked %d, want 1", sum.MarkedFromRedis)
	}
}

// Deleting the lock mid-sweep stops it within one renewal period, and its
// later write is refused by the fence once a successor has run.
func TestLostLockStopsSweepAndFenceRefusesIt(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ids := e.insertPending(4)
	e.markKeyDelivered(ids[1])
	ttl := 900 * time.Millisecond // renewal every 300 ms
	stale := e.reconciler(Config{LockTTL: ttl})
	inHook, goOn := make(chan struct{}), make(chan struct{})
	deletedAt := make(chan time.Time, 1)
	lostAfter := make(chan time.Duration, 1)
	stale.hooks.beforeMark = func(ctx context.Context) {
		close(inHook)
		deleted := <-deletedAt
		select {
		case <-ctx.Done():
			lostAfter <- time.Since(deleted)
		case <-time.After(5 * time.Second):
			lostAfter <- -1
		}
		<-goOn
	}
	done := make(chan error, 1)
	go func() {
		_, err := stale.RunOnce(context.Background(), time.Now(), time.Second)
		done <- err
	}()
	<-inHook
	e.rdb.Del(context.Background(), e.prefix+keys.ReconcileLock)
	deletedAt <- time.Now()
	// The watchdog checks every ttl/3; the bound that matters is stopping
	// before the lease could have been handed to someone else (one TTL).
	if d := <-lostAfter; d < 0 || d > ttl {
		t.Fatalf("sweep noticed the lost lock after %s, want within the lease (%s; renewal every %s)", d, ttl, ttl/3)
	} else {
		t.Logf("noticed %s after the key was deleted (renewal period %s)", d, ttl/3)
	}

	successor := e.reconciler(Config{LockTTL: ttl})
	sum, err := successor.RunOnce(context.Background(), time.Now().Add(time.Second), time.Second)
	if err != nil || sum.MarkedFromRedis != 1 || sum.FencingToken <= 1 {
		t.Fatalf("successor: %+v, %v", sum, err)
	}
	close(goOn)
	err = <-done
	if !errors.Is(err, store.ErrStaleFence) {
		t.Fatalf("stale sweep's write: %v, want ErrStaleFence", err)
	}
	if n := testutil.ToFloat64(stale.m.FenceRejections.WithLabelValues(keys.ReconcileLock)); n != 1 {
		t.Fatalf("fence rejections counted %v, want 1", n)
	}
}

// Retention deletes exactly the old delivered rows of 100k, in bounded
// batches; pending, recent and dead rows survive; keys of "1" get marked.
func TestRetentionAndMarkSweeps(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const batch = 1000
	// 100k rows: 60k delivered long ago, 20k delivered recently, 15k pending, 5k dead long ago.
	e.exec(`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at, dispatched_at, dead_at)
		SELECT 'deal', (i % 500)::text, 'deal.funded', '{}', now() - interval '30 days',
		  CASE WHEN i <= 60000 THEN now() - interval '10 days'
		       WHEN i <= 80000 THEN now() - interval '1 hour' END,
		  CASE WHEN i > 95000 THEN now() - interval '20 days' END
		FROM generate_series(1, 100000) i`)
	pending := e.insertPending(2)
	e.markKeyDelivered(pending[0])
	// Count rows per DELETE statement to prove the batches are bounded.
	e.exec(`CREATE TABLE delete_sizes (n bigint)`)
	e.exec(`CREATE FUNCTION count_deletes() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
		INSERT INTO delete_sizes SELECT count(*) FROM old_rows; RETURN NULL; END $$`)
	e.exec(`CREATE TRIGGER count_deletes AFTER DELETE ON outbox REFERENCING OLD TABLE AS old_rows
		FOR EACH STATEMENT EXECUTE FUNCTION count_deletes()`)

	r := e.reconciler(Config{Retention: 7 * 24 * time.Hour, BatchSize: batch})
	sum, err := r.RunOnce(context.Background(), time.Now(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if sum.PurgedDelivered != 60000 || sum.PurgedDead != 0 || sum.MarkedFromRedis != 1 {
		t.Fatalf("summary %+v: want 60000 purged, 0 dead purged, 1 marked", sum)
	}
	if n := e.count(`SELECT count(*) FROM outbox WHERE dispatched_at > now() - interval '2 hours'`); n != 20001 {
		t.Fatalf("%d recent delivered rows left, want 20000 + the one just marked", n)
	}
	if n := e.count(`SELECT count(*) FROM outbox WHERE dispatched_at IS NULL AND dead_at IS NULL`); n != 15001 {
		t.Fatalf("%d pending rows left, want 15001", n)
	}
	if n := e.count(`SELECT count(*) FROM outbox WHERE dead_at IS NOT NULL`); n != 5000 {
		t.Fatalf("%d dead rows left, want 5000 (dead_retention 0 keeps them)", n)
	}
	if max := e.count(`SELECT COALESCE(max(n), 0) FROM delete_sizes`); max > batch {
		t.Fatalf("a DELETE removed %d rows, above the batch of %d", max, batch)
	}
	if sum.Pending != 15001 || sum.Dead != 5000 {
		t.Fatalf("report %+v", sum)
	}

	// With dead retention, old dead rows go too.
	r2 := e.reconciler(Config{Retention: 7 * 24 * time.Hour, DeadRetention: 14 * 24 * time.Hour, BatchSize: batch})
	sum, err = r2.RunOnce(context.Background(), time.Now().Add(time.Second), time.Second)
	if err != nil || sum.PurgedDead != 5000 {
		t.Fatalf("dead purge: %+v %v", sum, err)
	}
	if n := e.count(`SELECT count(*) FROM outbox WHERE dispatched_at IS NULL AND dead_at IS NULL`); n != 15001 {
		t.Fatalf("pending rows touched by the dead purge: %d left", n)
	}
}

func TestBadScheduleIsRefused(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, err := New(Config{Schedule: "every day"}, Deps{Store: e.st, Locks: redislease.New([]redis.UniversalClient{e.rdb}),
		Redis: e.rdb, Log: slog.Default(), Metrics: metrics.New()})
	if err == nil || !strings.Contains(err.Error(), "every") {
		t.Fatalf("got %v, want the parse error", err)
	}
	for _, spec := range []string{"* * *", "61 * * * *", "@every soon"} {
		if _, err := ParseSchedule(spec); err == nil {
			t.Errorf("schedule %q accepted", spec)
		}
	}
}

// An idempotency key of the wrong type does not stop the repair sweep: the
// other rows are still marked from Redis, and the run succeeds.
func TestWrongTypedKeyDoesNotStopTheSweep(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ids := e.insertPending(3)
	e.markKeyDelivered(ids[0])
	e.markKeyDelivered(ids[2])
	if err := e.rdb.HSet(context.Background(), e.prefix+"idempotency:notify:"+strconv.FormatInt(ids[1], 10), "f", "v").Err(); err != nil {
		t.Fatal(err)
	}
	sum, err := e.reconciler(Config{}).RunOnce(context.Background(), time.Now(), time.Second)
	if err != nil || sum.MarkedFromRedis != 2 {
		t.Fatalf("summary %+v, err %v: want the 2 rows marked and no error", sum, err)
	}
	if n := e.count(`SELECT count(*) FROM outbox WHERE dispatched_at IS NULL`); n != 1 {
		t.Fatalf("%d rows pending, want only the one with the wrong-typed key", n)
	}
}

// The repair sweep marks a row only from its own delivered mark: a mark
// left by an earlier row with the same id (ids reused), a bare "1" of
// an earlier version written before the row was created, or a mark of the
// earlier format that names no payload, marks nothing; a bare "1" written
// after it (the upgrade window) does.
func TestMarkSweepTrustsOnlyTheRowsOwnMark(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ids := e.insertPending(6)
	var created time.Time
	if err := e.st.Pool().QueryRow(context.Background(), `SELECT created_at FROM outbox WHERE id = $1`, ids[0]).Scan(&created); err != nil {
		t.Fatal(err)
	}
	age := time.Since(created)
	e.markKeyDelivered(ids[0])                                                                                                                 // own mark: marked
	e.setKey(ids[1], keys.Delivered(keys.Fingerprint(created.Add(-time.Hour), "deal", "1", "deal.funded", keys.Content{})), keys.DeliveredTTL) // earlier row's
	e.setKey(ids[2], "1", keys.DeliveredTTL)                                                                                                   // legacy, just written: marked
	e.setKey(ids[3], "1", keys.DeliveredTTL-age-keys.LegacySkew-time.Minute)                                                                   // legacy, before the row
	e.setKey(ids[4], "1", 0)                                                                                                                   // legacy without a TTL
	own := e.fingerprint(ids[5])
	e.setKey(ids[5], "1:"+own[:strings.LastIndexByte(own, '.')], keys.DeliveredTTL) // the earlier format, without the content
	sum, err := e.reconciler(Config{}).RunOnce(context.Background(), time.Now(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if sum.MarkedFromRedis != 2 {
		t.Errorf("marked %d, want 2 (own mark, fresh legacy mark)", sum.MarkedFromRedis)
	}
	for i, want := range []bool{true, false, true, false, false, false} {
		got := e.count(`SELECT count(*) FROM outbox WHERE id = $1 AND dispatched_at IS NOT NULL`, ids[i]) == 1
		if got != want {
			t.Errorf("row %d (key case %d): marked %v, want %v", ids[i], i, got, want)
		}
	}
}
