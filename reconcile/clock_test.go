package reconcile

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testenv"
)

// Retention is measured on Postgres's clock, the one that wrote
// dispatched_at and dead_at (DESIGN "Time"): with Postgres an hour ahead
// of the relay or an hour behind it, a one-hour retention purges the rows
// delivered or dead-lettered 90 minutes ago and keeps those of 30 minutes
// ago. A cutoff from the relay's clock purged nothing in the one case and
// every row in the other.
func TestRetentionIsMeasuredOnPostgresClock(t *testing.T) {
	t.Parallel()
	for _, offset := range []time.Duration{time.Hour, -time.Hour} {
		t.Run(fmt.Sprintf("postgres%+ds", int(offset.Seconds())), func(t *testing.T) {
			t.Parallel()
			pg := testenv.StartPostgresServerClock(t, offset)
			e := setupOn(t, pg.DSN)
			e.exec(`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, dispatched_at, dead_at)
				SELECT 'deal', i::text, 'deal.funded', '{}',
				  CASE i WHEN 1 THEN now() - interval '90 minutes' WHEN 2 THEN now() - interval '30 minutes' END,
				  CASE i WHEN 3 THEN now() - interval '90 minutes' WHEN 4 THEN now() - interval '30 minutes' END
				FROM generate_series(1, 4) i`)
			r := e.reconciler(Config{Retention: time.Hour, DeadRetention: time.Hour})
			sum, err := r.RunOnce(context.Background(), time.Now(), time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if sum.PurgedDelivered != 1 || sum.PurgedDead != 1 {
				t.Fatalf("purged %d delivered and %d dead, want 1 and 1 (those of 90 minutes ago)", sum.PurgedDelivered, sum.PurgedDead)
			}
			if n := e.count(`SELECT count(*) FROM outbox WHERE aggregate_id IN ('2', '4')`); n != 2 {
				t.Fatalf("%d of the 2 rows settled 30 minutes ago left", n)
			}
		})
	}
}

// A run is recorded, its summary stored, in the query exec modes a DSN
// behind a transaction pooler chooses (exec, simple_protocol): its sweeps
// ran, and the run is not reported failed.
func TestRunIsRecordedInEveryQueryExecMode(t *testing.T) {
	t.Parallel()
	dsn := testenv.DSN(t)
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	for i, mode := range []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"} {
		e := setupOn(t, dsn+sep+"default_query_exec_mode="+mode)
		e.insertPending(3)
		fire := time.Date(2026, 1, 1, 0, i, 0, 0, time.UTC)
		if _, err := e.reconciler(Config{}).RunOnce(context.Background(), fire, time.Second); err != nil {
			t.Fatalf("%s: the run: %v", mode, err)
		}
		if n := e.count(`SELECT count(*) FROM reconcile_runs WHERE fire_time = $1 AND (summary->>'pending')::int >= 3`, fire); n != 1 {
			t.Fatalf("%s: the run's summary was not stored", mode)
		}
	}
}

// setupOn is setup on the migrated database at dsn.
func setupOn(t *testing.T, dsn string) *testBundle {
	t.Helper()
	rdb, prefix := testenv.Redis(t)
	return &testBundle{t: t, st: testenv.StoreAt(t, dsn), rdb: rdb, prefix: prefix}
}
