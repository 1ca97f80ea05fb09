package poller

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestMeasureBulkGaps is a measurement, not a check: with
// OUTBOXD_TEST_MEASURE_BULK=N set, one transaction
// inserts N rows and stays open while 2,000 events are committed above it
// (200 transactions of 10) and delivered; it logs the heap in use after a
// GC, the process's CPU seconds per 1,000 events in that phase (the test's
// producers included), and the reads. Skipped otherwise.
func TestMeasureBulkGaps(t *testing.T) {
	n, err := strconv.Atoi(os.Getenv("OUTBOXD_TEST_MEASURE_BULK"))
	if err != nil {
		t.Skip("OUTBOXD_TEST_MEASURE_BULK=N (rows held by one open transaction) runs this measurement")
	}
	e := setup(t)
	ctx := context.Background()
	cfg := testConfig()
	cfg.LockTTL = 30 * time.Second
	r := e.poller(cfg, "")
	e.run(r)
	warm := e.produce("warm")
	e.waitFor("the runner delivering", time.Minute, func() bool { return e.delivered(warm) })
	tx, err := e.st.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'deal', 'b' || (g % 1000), 'deal.funded', '{}' FROM generate_series(1, $1::int) g ORDER BY g`, n); err != nil {
		t.Fatal(err)
	}
	cpu := func() float64 {
		var ru syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
	}
	reads := func() int64 {
		if rd := r.rd; rd != nil {
			return rd.gaps.reads // racy read: a measurement, run without -race
		}
		return 0
	}
	c0, r0, t0 := cpu(), reads(), time.Now()
	var last int64
	for i := range 200 {
		err := pgx.BeginFunc(ctx, e.st.Pool(), func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, `WITH i AS (INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
				SELECT 'deal', 'o' || g, 'deal.funded', '{}' FROM generate_series(1, 10) g RETURNING id) SELECT max(id) FROM i`).Scan(&last)
		})
		if err != nil {
			t.Fatal(err)
		}
		if i%20 == 0 {
			time.Sleep(100 * time.Millisecond)
		}
	}
	e.waitFor("the 2,000 events delivered", 10*time.Minute, func() bool { return e.delivered(last) })
	time.Sleep(2 * time.Second) // the gaps grow old: reads behind the open transaction
	c1, r1, took := cpu(), reads(), time.Since(t0)
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	t.Logf("MEASURE held=%d heap_inuse_mb=%.1f cpu_s_per_1k_events=%.3f reads=%d cpu_ms_per_read=%.3f wall=%v",
		n, float64(ms.HeapInuse)/(1<<20), (c1-c0)/2, r1-r0, (c1-c0)*1000/float64(max(r1-r0, 1)), took.Round(time.Millisecond))
}
