package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/internal/testenv"
)

var (
	pgMode = flag.String("pg", "shared", "shared: the -dsn server (autovacuum off on this project's machines); "+
		"private-autovacuum: a private Postgres started for this run (internal/testenv: fsync off, autovacuum on, server defaults otherwise)")
	tableAV = flag.Bool("table-autovacuum", true, "false: ALTER TABLE outbox SET (autovacuum_enabled = off) after the migration "+
		"(autovacuum off on a -pg private-autovacuum server, for a same-server comparison)")
)

// build is one outboxd binary, the label its results carry, and the
// settings every relay of it is started with (a lease backend's, -backends).
type build struct {
	label, path string
	sets        []string
}

// parseBins reads -bin: "path" or "label=path", comma-separated.
func parseBins(list string) []build {
	var out []build
	for _, s := range strings.Split(list, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		label, path, ok := strings.Cut(s, "=")
		if !ok {
			label, path = filepath.Base(s), s
		}
		if _, err := os.Stat(path); err != nil {
			check(fmt.Errorf("-bin %s: %w", s, err))
		}
		out = append(out, build{label: label, path: path})
	}
	return out
}

// ---- cleanup on every exit ----

var (
	exitMu    sync.Mutex
	exitFuncs []func()
)

// atExit registers f to run when the bench exits, by check or a signal
// too: a private Postgres must not outlive the run.
func atExit(f func()) {
	exitMu.Lock()
	defer exitMu.Unlock()
	exitFuncs = append(exitFuncs, f)
}

func runAtExit() {
	exitMu.Lock()
	fs := exitFuncs
	exitFuncs = nil
	exitMu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}

func catchSignals() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ch
		runAtExit()
		os.Exit(130)
	}()
}

// ---- Postgres ----

// exitTB lets internal/testenv's server helpers run outside a test: a
// failure ends the bench (after the cleanups), a cleanup runs at exit.
type exitTB struct{ testing.TB }

func (exitTB) Helper()                         {}
func (exitTB) Fatal(args ...any)               { check(fmt.Errorf("%s", fmt.Sprint(args...))) }
func (exitTB) Fatalf(format string, a ...any)  { check(fmt.Errorf(format, a...)) }
func (exitTB) Cleanup(f func())                { atExit(f) }
func (exitTB) Logf(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }

// selectPostgres points -dsn at a private server for -pg private-autovacuum.
// The shared server has autovacuum off and is not ours to reconfigure; the
// private one runs with Postgres' defaults (autovacuum on), fsync off.
func selectPostgres() {
	switch *pgMode {
	case "shared":
	case "private-autovacuum":
		s := testenv.StartPostgresServer(exitTB{})
		*pgDSN = s.DSN
		privateLog = s.LogPath()
		fmt.Printf("blackbox: private Postgres at %s\n", s.DSN)
	default:
		check(fmt.Errorf("unknown -pg %q (shared, private-autovacuum)", *pgMode))
	}
	conn, err := pgx.Connect(context.Background(), *pgDSN)
	check(err)
	defer conn.Close(context.Background())
	applyPgSets(context.Background(), *pgDSN)
	var av, fsync string
	check(conn.QueryRow(context.Background(), `SELECT current_setting('autovacuum'), current_setting('fsync')`).Scan(&av, &fsync))
	fmt.Printf("blackbox: server autovacuum %s, fsync %s, table autovacuum %v\n", av, fsync, *tableAV)
	serverAutovacuum = av == "on"
}

// serverAutovacuum: the -dsn server's own autovacuum setting (a server
// started by hand with autovacuum on is as good as -pg private-autovacuum).
var serverAutovacuum bool

// autovacuumWord says whether autovacuum can reach the outbox table.
func autovacuumWord() string {
	if serverAutovacuum && *tableAV {
		return "on"
	}
	return "off"
}

// tableAutovacuum applies -table-autovacuum to a migrated run database.
func tableAutovacuum(ctx context.Context, pool *pgxpool.Pool) {
	if !*tableAV {
		_, err := pool.Exec(ctx, `ALTER TABLE outbox SET (autovacuum_enabled = off)`)
		check(err)
	}
}

// holdSnapshotOpen opens a REPEATABLE READ transaction in the database and
// runs a first SELECT, so its snapshot is taken: from then on no row
// version that was live then can be vacuumed away, nor its index entries,
// in this database. It stays open until the returned func runs (a report,
// pg_dump, an idle-in-transaction session).
func holdSnapshotOpen(ctx context.Context, dsn string) func() {
	conn, err := pgx.Connect(ctx, dsn)
	check(err)
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	check(err)
	var n int64
	check(tx.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&n))
	var xmin string
	check(tx.QueryRow(ctx, `SELECT backend_xmin::text FROM pg_stat_activity WHERE pid = pg_backend_pid()`).Scan(&xmin))
	fmt.Printf("    snapshot held (xmin %s, %d rows visible to it)\n", xmin, n)
	return func() {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		_ = conn.Close(context.WithoutCancel(ctx))
	}
}

// insertBacklog adds n pending events (~220-byte payloads over -aggregates
// aggregates, 1,000 by default) in one statement.
func insertBacklog(ctx context.Context, pool *pgxpool.Pool, n int) {
	_, err := pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'deal', (i % @aggregates)::text, 'deal.funded',
		  jsonb_build_object('seq', i, 'deal', 'deal-' || (i % @aggregates), 'amount_cents', i * 7, 'pad', repeat('x', @pad))
		FROM generate_series(1, @rows) i`, pgx.NamedArgs{"rows": n, "pad": payloadPad, "aggregates": *slowAggs})
	check(err)
}

// loadAvg is /proc/loadavg's first three figures: the machine is shared.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// since is a duration in ms, for result lines.
func since(t time.Time) float64 { return float64(time.Since(t).Microseconds()) / 1000 }

// awaitDrained returns once the relay d has counted want events
// dispatched (outboxd_dispatched_total). Until the backlog's last row
// (the highest id, which the relay reads last) is marked, it reads only
// that row's dispatched_at, by primary key: a scrape of /metrics every
// poll would refresh the backlog gauges from Postgres each time (a count
// over the pending index, and under a held snapshot over every row
// delivered since) and gzip the page, a load no peer carries and no
// Prometheus at its usual interval makes; the counter is scraped only
// after that, a few times at most.
//
// Each poll also samples the server's checkpointer (its wait event in
// pg_stat_activity: CheckpointerMain while no checkpoint runs); the result
// is the share of the polls that found a checkpoint running, so a slow run
// can be told from one that shared the disk with a checkpoint's writes.
func awaitDrained(ctx context.Context, pool *pgxpool.Pool, d *daemon, want float64) (checkpointing float64) {
	var lastID int64
	check(pool.QueryRow(ctx, `SELECT max(id) FROM outbox`).Scan(&lastID))
	polls, busy := 0, 0
	for {
		var done, ckpt bool
		check(pool.QueryRow(ctx, `SELECT (SELECT dispatched_at IS NOT NULL FROM outbox WHERE id = @id),
			EXISTS (SELECT 1 FROM pg_stat_activity WHERE backend_type = 'checkpointer' AND wait_event IS DISTINCT FROM 'CheckpointerMain')`,
			pgx.NamedArgs{"id": lastID}).Scan(&done, &ckpt))
		polls++
		if ckpt {
			busy++
		}
		if done {
			break
		}
		d.checkAlive()
		time.Sleep(50 * time.Millisecond)
	}
	for d.dispatched() < want {
		d.checkAlive()
		time.Sleep(250 * time.Millisecond)
	}
	return float64(busy) / float64(polls)
}
