package poller

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Result writes commit asynchronously (store.Complete). A Postgres crash
// right after a drain forgets the last of them; the rows come back pending,
// and the next runner finds them delivered in Redis and marks them without
// sending them again: the crash costs no duplicate delivery here, and could
// cost at most duplicates if Redis had lost the keys too.
func TestPostgresCrashForgetsResultsButSendsNothingTwice(t *testing.T) {
	e := newEnv(t)
	pg, st := e.privatePostgres()
	ctx := context.Background()
	// The WAL writer flushes asynchronous commits every wal_writer_delay:
	// make that longer than the test, so the crash finds them unwritten
	// (set at a restart: a reload reaches the WAL writer only when it wakes).
	// Any synchronous commit flushes them too: no autovacuum, and a lease
	// long enough that a loaded machine does not lose and re-claim it (the
	// fence claim commits synchronously).
	for _, set := range []string{`ALTER SYSTEM SET wal_writer_delay = '10s'`, `ALTER SYSTEM SET autovacuum = off`} {
		if _, err := st.Pool().Exec(ctx, set); err != nil {
			t.Fatal(err)
		}
	}
	pg.CrashRestart()
	st.Pool().Reset()
	ids := e.insert(50, 10) // producers commit synchronously
	cfg := testConfig()
	cfg.BatchSize, cfg.LockTTL = 10, 10*time.Second
	stop := e.run(e.poller(cfg, ""))
	e.waitAllDispatched(30 * time.Second)
	stop()

	pg.CrashRestart()
	st.Pool().Reset() // the pool's connections died with the server
	lost := e.count("dispatched_at IS NULL")
	if lost == 0 {
		t.Fatal("the crash forgot no result write: Complete committed synchronously")
	}
	r := e.poller(cfg, "")
	e.run(r)
	e.waitAllDispatched(30 * time.Second)
	if dups := e.checkDelivered(ids); dups != 0 {
		t.Fatalf("%d events sent twice after the crash", dups)
	}
	// The count follows the mark, which other sessions see first.
	e.waitFor("the forgotten rows counted as already delivered", 10*time.Second,
		func() bool { return testutil.ToFloat64(r.m.Duplicates) >= float64(lost) })
	if got := testutil.ToFloat64(r.m.Duplicates); got != float64(lost) {
		t.Fatalf("%v rows marked from Redis' delivered keys, want the %d whose marks the crash forgot", got, lost)
	}
}
