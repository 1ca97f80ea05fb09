// Command blackbox measures what users get: it builds outboxd, starts the
// binary as an operator would (`outboxd migrate`, then `outboxd run` with a
// no-op sink, or with -sink a broker set up beforehand, see sinks.go), and
// times it from the outside. Each run has a fresh database and Redis key
// prefix.
//
//	drain    a backlog of -rows events (~220-byte payloads over 1,000
//	         aggregates) at each -batches size, alternated in every round with
//	         watermill-sql's forwarder on the same Postgres; events/s from the
//	         process start to the last row marked, peak RSS, and CPU per 1,000
//	         events of the relay, Postgres and Redis
//	latency  producers commit -rate events/s (-per-tx per transaction) for
//	         -for while the binary runs; commit → marked delivered
//	         (dispatched_at) p50/p95/p99 and relay CPU per run, and per
//	         -window of commit time; -tracing off,on alternates runs with
//	         tracing off and on (OTLP/HTTP to a receiver in the bench); -hold-snapshot keeps a REPEATABLE READ transaction open in
//	         the database all along; -producers K makes K racing producers
//	         (BEGIN, INSERT, [-tx-hold], COMMIT: ids taken in one order,
//	         visible in another); -aggregates N spreads the events over N
//	         aggregates; -long-tx D adds one producer whose every
//	         transaction stays open D after its INSERT; -gap-wait runs each
//	         listed poller.gap_wait in turn. Each run also reports
//	         outboxd_late_commits_total, outboxd_gaps_given_up_total and the
//	         events marked (an upper bound) or, with -webhook, received
//	         after a later event of their aggregate
//	history  -rows pending events drained on a clean table, and behind
//	         -history rows marked dispatched while a snapshot was held (kept
//	         open during the drain, so nothing of them can be vacuumed); -stuck-row leaves the
//	         history's first row backing off, so a relay with no cursor
//	         saved checks the whole history for late commits
//	backlog  a -small and a -rows backlog drained in turn; the rate ratio
//	order    two transactions on one aggregate, the lower id committing -late
//	         after the higher (and one rolling back), other aggregates
//	         producing meanwhile; the order the webhook receiver saw, the
//	         outboxd_late_commits_total count and whether "late commit" was
//	         logged
//	lease    per build and -backends entry, a leader and a standby on one
//	         database: the leader signalled (SIGTERM: graceful handover;
//	         SIGKILL: crash takeover, waiting out -lease-ttl), one event
//	         committed; the time from the signal to its mark by the standby
//	slow     a -rows backlog over -aggregates aggregates through the webhook
//	         to a receiver answering in -receiver-delay (-straggler: one
//	         aggregate's events take that long each), per -concurrency;
//	         the other aggregates' ev/s and when each finished, peak RSS
//	console  a -rows backlog drained with the ops port idle and beside
//	         -console-clients clients reading the console (/ui) every
//	         -console-every; the ratio of the drains' times
//
// -bin takes a comma list of builds (label=path), alternated in every round
// or run. -pg private-autovacuum runs everything on a private Postgres
// (internal/testenv; autovacuum on, fsync off) instead of the shared server
// (autovacuum off, as on CI); -table-autovacuum=false turns it off for the
// outbox table there. Every result line carries /proc/loadavg at its start:
// the machine is shared.
//
// Correlating a latency tail with the server (pokes.go): -dump PREFIX
// writes each event's commit time and latency, and beside it the times of
// -poke statements run at known offsets (CHECKPOINT, ANALYZE outbox, ...),
// -sample-waits samples of the relay's sessions in pg_stat_activity, and
// the private server's log (-pg-set log_checkpoints=on;... applied by
// ALTER SYSTEM on a -pg private-autovacuum server). Without -dump, every
// latency run still lists each -window's producer transaction p99 and max
// (a stall in the server's commit path shows there as in the relay's
// latency) and the checkpoints the server finished during the run, on the
// windows' clock.
//
// A stall and what it costs after (pause.go): -pause postgres@40s:2s stops
// every process of the Postgres server for 2 s at 40 s (SIGSTOP, then
// SIGCONT: the whole database stalls, as when its WAL flush does; the bench
// must run as a user that may signal them), -pause relay@40s:2s stops the
// relay only; each pause's line says how many of the events committed
// after it took over 10 ms, until when, and the slowest.
//
// With -profile DIR, each outboxd drain also writes a CPU profile of the
// relay (http.pprof), Postgres' pg_stat_statements (when the extension is
// loaded) and Redis' INFO commandstats into DIR.
//
// With -report, it runs every measure of BENCHMARKS.md against one build
// and rewrites the report's tables and plot (report.go).
//
//	cd bench && go run ./blackbox -report
//	cd bench && go run ./blackbox -rounds 3
//	cd bench && go run ./blackbox -rounds 1 -peer=false -sink noop,webhook,kafka,nats,rabbitmq,redis_stream
//	cd bench && go run ./blackbox -rounds 1 -peer=false -rows 100000 -sink sqs,sns
//	cd bench && go run ./blackbox -scenario latency -runs 5 -rate 1000
//	cd bench && go run ./blackbox -bin before=/tmp/bins/before,after=/tmp/bins/readpath \
//	    -scenario latency -hold-snapshot -rate 2000 -for 3m -window 1m -runs 1 -pg private-autovacuum
//	cd bench && go run ./blackbox -scenario history -rounds 3 -rows 100000 -history 1000000
//	cd bench && go run ./blackbox -scenario backlog -rounds 3 -rows 1000000 -small 100000
//	cd bench && go run ./blackbox -scenario latency -producers 8 -rate 5000 -per-tx 5 -for 30s -runs 3
//	cd bench && go run ./blackbox -scenario latency -hold-snapshot -rate 2000 -for 2m -window 20s -runs 1 -pg private-autovacuum \
//	    -set 'reconcile.schedule=@every 20s' -pg-set 'log_min_duration_statement=15' -poke '20s/30s=ANALYZE outbox' -sample-waits 10ms -dump /tmp/tail/r
//	cd bench && go run ./blackbox -scenario latency -producers 8 -rate 1000 -tx-hold 5ms -aggregates 100 -gap-wait 1ms,10ms,50ms,200ms -runs 2
//	cd bench && go run ./blackbox -scenario latency -producers 8 -rate 1000 -long-tx 2s -aggregates 100 -gap-wait 10ms,50ms,200ms,1s -runs 2
//	cd bench && go run ./blackbox -scenario order -runs 1 -late 2s,30s
//	cd bench && go run ./blackbox -scenario latency -rate 2000 -for 1m -runs 3 -pause postgres@40s:2s -dsn postgres://postgres@127.0.0.1:5511/postgres
//	cd bench && go run ./blackbox -scenario slow -rounds 1 -rows 20000 -receiver-delay 20ms -aggregates 1000 [-straggler 500ms]
//	cd bench && go run ./blackbox -scenario dead-readers -rounds 3 -rows 2000 -dead 200000 -readers 32
//	cd bench && go run ./blackbox -scenario console -rounds 3 -rows 100000 -console-every 1s
package main

import (
	"bufio"
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/outboxd/outboxd/bench/benchenv"
	"github.com/outboxd/outboxd/bench/peer"
)

var (
	pgDSN      = flag.String("dsn", benchenv.PostgresDSN(), "maintenance DSN (databases are created beside it)")
	redisAddr  = flag.String("redis", benchenv.RedisAddr(), "Redis address")
	scenario   = flag.String("scenario", "drain", "drain, latency, history, backlog, order, slow, dead-readers, lease or console")
	rounds     = flag.Int("rounds", 3, "drain: rounds (each runs every batch size for outboxd and the peer)")
	batches    = flag.String("batches", "1000,100", "drain: poller.batch_size values")
	rows       = flag.Int("rows", 100000, "drain: backlog size")
	withPeer   = flag.Bool("peer", true, "drain: alternate with watermill-sql's forwarder")
	withBare   = flag.Bool("bare", true, "drain: alternate with the bare protocol (peer.BareDrain: fetch, a pipeline of claims, one of marks, one fenced UPDATE; no sink), the ceiling outboxd's share is given of")
	sinks      = flag.String("sink", "noop", "drain: dispatch.sink, or a comma list run in turn: noop, webhook, kafka, nats, rabbitmq, redis_stream, pubsub, kinesis, sqs, sns")
	profile    = flag.String("profile", "", "drain: write relay CPU profiles, pg_stat_statements and Redis commandstats here")
	profileFor = flag.Duration("profile-for", 3*time.Second, "drain: length of the relay CPU profile (from the relay's start; make it cover the drain)")
	runs       = flag.Int("runs", 5, "latency: runs")
	rate       = flag.Int("rate", 1000, "latency: events/s")
	perTx      = flag.Int("per-tx", 1, "latency: events per producer transaction")
	steadyFor  = flag.Duration("for", 10*time.Second, "latency: measured duration (after a 1 s warm-up)")
	latBatch   = flag.Int("batch", 500, "latency, order, slow: poller.batch_size")
	latDump    = flag.String("dump", "", "latency: write each event's commit time (s from start) and latency (ms) to this file prefix")
	binPath    = flag.String("bin", "", "outboxd binaries to run, a comma list of path or label=path, alternated in every round or run (default: build ../cmd/outboxd)")
	sets       = flag.String("set", "", "extra --set key=value pairs for outboxd run, comma-separated")
	latWebhook = flag.Bool("webhook", false, "latency: deliver through the webhook sink to a receiver in the bench, and also report commit → received")
	prodAsync  = flag.Bool("producers-async", false, "latency: producers commit with synchronous_commit off (to tell the disk's share of the tail)")
	dsnParams  = flag.String("dsn-params", "", "appended to the relay's postgres.dsn query, e.g. options=-c%20plan_cache_mode%3Dforce_generic_plan")

	window       = flag.Duration("window", 0, "latency: also report commit → marked per window of this length (e.g. 1m), so growth over the run shows")
	holdSnapshot = flag.Bool("hold-snapshot", false, "latency: hold a REPEATABLE READ transaction (snapshot taken) open in the run's database for the whole run")
	producers    = flag.Int("producers", 0, "latency: racing producers, each BEGIN, INSERT, COMMIT on its own connection (0: one-statement transactions, up to 16 at once)")
	txHold       = flag.Duration("tx-hold", 0, "latency with -producers: time between a producer's INSERT and its COMMIT")
	tracing      = flag.String("tracing", "", "latency: off, on, or off,on (each run once per mode): on exports every span over OTLP/HTTP to a receiver in the bench (OTEL_* set for the relay), off clears OTEL_*; empty: the environment as it is")
	gapWaits     = flag.String("gap-wait", "", "latency: poller.gap_wait values, a comma list run in turn in every run (empty: the build's default)")
	pgCPUScope   = flag.String("pg-cpu", "server", "Postgres CPU: server (the postmaster and every process it started) or database (only the backends connected to the run's database: on a server others use meanwhile)")
	longTx       = flag.Duration("long-tx", 0, "latency: one more producer keeps each of its transactions open this long after its INSERT, one after another, all run long (a long writing transaction)")
)

// buildThisTree builds ../cmd/outboxd into a temporary folder removed at
// exit and returns the binary's path.
func buildThisTree() string {
	dir, err := os.MkdirTemp("", "outboxd-blackbox")
	check(err)
	atExit(func() { _ = os.RemoveAll(dir) })
	bin := filepath.Join(dir, "outboxd")
	gobuild := exec.Command("go", "build", "-C", "..", "-o", bin, "./cmd/outboxd")
	gobuild.Stdout, gobuild.Stderr = os.Stderr, os.Stderr
	check(gobuild.Run())
	return bin
}

// payloadPad makes a row's payload about 220 bytes, like the figures.
const payloadPad = 170

func main() {
	flag.Parse()
	parsePauses(*pauses) // a bad -pause ends the bench before any run
	ctx := context.Background()
	defer runAtExit()
	catchSignals()
	bins := parseBins(*binPath)
	if len(bins) == 0 {
		bins = []build{{label: "this tree", path: buildThisTree()}}
	}
	if *report || *reportSmoke {
		runReport(bins[0].path)
		return
	}
	selectPostgres()
	bins = withBackends(bins)
	for _, b := range bins {
		fmt.Printf("blackbox: %s = %s, GOMAXPROCS %q, %s, postgres %s, load %s\n", b.label, b.path, os.Getenv("GOMAXPROCS"), time.Now().UTC().Format(time.RFC3339), *pgMode, loadAvg())
	}
	switch *scenario {
	case "drain":
		drainRounds(ctx, bins)
	case "latency":
		latencyRuns(ctx, bins)
	case "history":
		historyRounds(ctx, bins)
	case "backlog":
		backlogRounds(ctx, bins)
	case "order":
		orderProbes(ctx, bins)
	case "slow":
		slowRounds(ctx, bins)
	case "dead-readers":
		deadReaderRounds(ctx, bins)
	case "lease":
		leaseRounds(ctx, bins)
	case "console":
		consoleRounds(ctx, bins)
	default:
		check(fmt.Errorf("unknown -scenario %q", *scenario))
	}
}

// ---- drain ----

type drainResult struct {
	load                  string // /proc/loadavg's 1-minute figure when the run began
	perSec                float64
	rssMiB                float64
	relayCPU, pgCPU, rCPU float64 // CPU seconds per 1,000 events
	mallocs, allocBytes   float64 // the relay's heap allocations and bytes allocated per event (go_memstats_*_total): counts load does not move
	checkpointing         float64 // share of the drain's polls that found a checkpoint running (awaitDrained)
}

func drainRounds(ctx context.Context, bins []build) {
	var sizes []int
	for _, s := range strings.Split(*batches, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		check(err)
		sizes = append(sizes, n)
	}
	names := sinkList()
	type key struct {
		bin   string
		sink  string
		batch int
	}
	ours := map[key][]drainResult{}
	theirs, bare := map[int][]float64{}, map[int][]drainResult{}
	for r := range *rounds {
		for _, b := range sizes {
			for _, bin := range bins {
				for _, s := range names {
					res := drainOutboxd(ctx, use(bin), s, b, *rows, fmt.Sprintf("r%d-b%d-%s-%s", r+1, b, s, bin.label), nil)
					ours[key{bin.label, s, b}] = append(ours[key{bin.label, s, b}], res)
					fmt.Printf("round %d batch %4d outboxd %s %-12s %8.0f ev/s  RSS %5.1f MiB  CPU s/1k events: relay %.4f  postgres %.4f  redis %.4f  relay allocs/event %.1f (%.0f B)  checkpoint running %.0f%%  (load %s)\n",
						r+1, b, bin.label, s, res.perSec, res.rssMiB, res.relayCPU, res.pgCPU, res.rCPU, res.mallocs, res.allocBytes, 100*res.checkpointing, res.load)
				}
			}
			if *withPeer {
				dsn, drop, err := benchenv.FreshDB(ctx, *pgDSN)
				check(err)
				d, err := peer.WatermillDrain(ctx, dsn, b, *rows, payloadPad+50, !*asWritten)
				drop()
				check(err)
				theirs[b] = append(theirs[b], float64(*rows)/d.Seconds())
				fmt.Printf("round %d batch %4d watermill %8.0f msg/s\n", r+1, b, theirs[b][len(theirs[b])-1])
			}
			if *withBare {
				res := drainBare(ctx, bins[0].path, b, *rows)
				bare[b] = append(bare[b], res)
				fmt.Printf("round %d batch %4d bare protocol %8.0f ev/s  CPU s/1k events: bench %.4f  postgres %.4f  redis %.4f  (load %s)\n",
					r+1, b, res.perSec, res.relayCPU, res.pgCPU, res.rCPU, res.load)
			}
		}
	}
	fmt.Printf("\n| build | sink | batch | outboxd (binary) ev/s min / median / max | watermill forwarder msg/s min / median / max | ratio of medians | peak RSS MiB (max) | CPU s per 1k events relay / Postgres / Redis (medians) | bare protocol ev/s min / median / max | share of the bare protocol (medians) | bare protocol CPU s per 1k events bench / Postgres / Redis (medians) |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, bin := range bins {
		for _, s := range names {
			for _, b := range sizes {
				var evs, rss, rc, pc, dc []float64
				for _, x := range ours[key{bin.label, s, b}] {
					evs, rss, rc, pc, dc = append(evs, x.perSec), append(rss, x.rssMiB), append(rc, x.relayCPU), append(pc, x.pgCPU), append(dc, x.rCPU)
				}
				peerCol, ratio := "not run", "—"
				if t := theirs[b]; len(t) > 0 {
					peerCol = mmm(t)
					ratio = fmt.Sprintf("%.2f×", median(evs)/median(t))
				}
				bareCol, share, bareCPU := "not run", "—", "—"
				if t := bare[b]; len(t) > 0 {
					var bevs, bc, bp, br []float64
					for _, x := range t {
						bevs, bc, bp, br = append(bevs, x.perSec), append(bc, x.relayCPU), append(bp, x.pgCPU), append(br, x.rCPU)
					}
					bareCol = mmm(bevs)
					share = fmt.Sprintf("%.0f%%", 100*median(evs)/median(bevs))
					bareCPU = fmt.Sprintf("%.4f / %.4f / %.4f", median(bc), median(bp), median(br))
				}
				fmt.Printf("| %s | %s | %d | %s | %s | %s | %.1f | %.4f / %.4f / %.4f | %s | %s | %s |\n", bin.label, s, b, mmm(evs), peerCol, ratio, slices.Max(rss), median(rc), median(pc), median(dc), bareCol, share, bareCPU)
			}
		}
	}
}

// run is one run's database (migrated by the binary) and key prefix.
type run struct {
	dsn, prefix string
	rdb         *redis.Client
	done        func()
}

func newRun(ctx context.Context, bin string) run {
	dsn, drop, err := benchenv.FreshDB(ctx, *pgDSN)
	check(err)
	r := run{dsn: dsn, prefix: benchenv.Prefix("bb"), rdb: redis.NewClient(&redis.Options{Addr: *redisAddr})}
	r.done = func() {
		benchenv.CleanKeys(r.rdb, r.prefix)
		_ = r.rdb.Close()
		drop()
	}
	// An interrupted bench still drops the database and keys (twice is harmless).
	atExit(r.done)
	runCmd(bin, "migrate", "--set", "postgres.dsn="+dsn)
	return r
}

// drainOutboxd times the relay on a backlog of rows pending events. setup,
// when not nil, runs after the migration and before the backlog is inserted
// (history for the backlog to sit behind); what it returns runs once the
// drain is timed.
func drainOutboxd(ctx context.Context, bin, sink string, batch, rows int, tag string, setup func(*pgxpool.Pool) func()) drainResult {
	load := loadAvg()
	r := newRun(ctx, bin)
	defer r.done()
	dsn, prefix, rdb := r.dsn, r.prefix, r.rdb
	dest := openDestination(ctx, sink, prefix, rdb)
	defer dest.close()
	pool, err := pgxpool.New(ctx, dsn)
	check(err)
	defer pool.Close()
	tableAutovacuum(ctx, pool)
	if setup != nil {
		release := setup(pool)
		defer release()
	}
	var d *daemon
	if *warm {
		// A running relay: it is started on the history, and has read past
		// it once one event written after it is delivered.
		d = startDaemon(ctx, bin, dsn, prefix, batch, *profile != "", dest.sets)
		defer d.stop()
		insertBacklog(ctx, pool, 1)
		for d.dispatched() < 1 {
			time.Sleep(50 * time.Millisecond)
			d.checkAlive()
		}
	}
	// Every run starts a checkpoint cycle here, so none is timed with a
	// checkpoint running, and, as in steady operation, the producers' inserts
	// pay the cycle's full-page writes, not the relay. With -as-written none
	// is started: a checkpoint the setup's WAL brings on may run while timed.
	if !*asWritten {
		_, err = pool.Exec(ctx, `CHECKPOINT`)
		check(err)
	}
	insertBacklog(ctx, pool, rows)
	if d != nil {
		// Timed from the backlog's commit. With -profile, the statements'
		// counts are those of the timed drain alone: reset at the commit.
		d.started = time.Now()
		statements := *profile != "" && resetPgStatStatements(ctx, pool)
		relayBefore, serverBefore := d.cpuSeconds(), serverCPU(ctx, pool)
		var prof *profileFetch
		if *profile != "" {
			prof = d.cpuProfile(filepath.Join(*profile, tag+".cpu.pprof"))
		}
		ckpt := awaitDrained(ctx, pool, d, float64(rows+1))
		var last time.Time
		check(pool.QueryRow(ctx, `SELECT max(dispatched_at) FROM outbox`).Scan(&last))
		res := drainResult{load: load, perSec: float64(rows) / last.Sub(d.started).Seconds(), checkpointing: ckpt}
		res.relayCPU = (d.cpuSeconds() - relayBefore) / (float64(rows) / 1000)
		res.pgCPU = (serverCPU(ctx, pool) - serverBefore) / (float64(rows) / 1000)
		if prof != nil {
			fmt.Printf("    %s: CPU s per 1k events from the backlog's commit to the last mark: relay %.3f, Postgres server (its processes only) %.3f\n", tag, res.relayCPU, res.pgCPU)
			prof.wait()
		}
		if statements {
			dumpPgStatStatements(ctx, pool, filepath.Join(*profile, tag+".pg_stat_statements.txt"))
		}
		return res
	}
	if !*asWritten {
		_, err = pool.Exec(ctx, `VACUUM ANALYZE outbox`)
		check(err)
	}
	statements := *profile != "" && resetPgStatStatements(ctx, pool)
	if *profile != "" {
		check(rdb.ConfigResetStat(ctx).Err())
	}

	pgBefore := serverCPU(ctx, pool)
	redisBefore := redisCPU(ctx, rdb)
	d = startDaemon(ctx, bin, dsn, prefix, batch, *profile != "", dest.sets)
	defer d.stop()
	var prof *profileFetch
	if *profile != "" {
		prof = d.cpuProfile(filepath.Join(*profile, tag+".cpu.pprof"))
	}
	// The end time comes from the rows themselves (awaitDrained polls
	// without loading the relay).
	ckpt := awaitDrained(ctx, pool, d, float64(rows))
	// The last row's mark is the end; the process start is the beginning
	// (what an operator restarting onto a backlog waits for).
	var last time.Time
	check(pool.QueryRow(ctx, `SELECT max(dispatched_at) FROM outbox`).Scan(&last))
	res := drainResult{load: load, perSec: float64(rows) / last.Sub(d.started).Seconds(), checkpointing: ckpt}
	dest.expect(sink, rows)
	// log.level is warn: anything the relay said is worth reading.
	if logs := d.logs.String(); logs != "" {
		fmt.Fprintf(os.Stderr, "outboxd %s said:\n%s", tag, logs)
	}
	res.rssMiB = d.peakRSSMiB()
	res.mallocs = d.metric("go_memstats_mallocs_total") / float64(rows)
	res.allocBytes = d.metric("go_memstats_alloc_bytes_total") / float64(rows)
	per1k := float64(rows) / 1000
	res.relayCPU = d.cpuSeconds() / per1k
	res.pgCPU = (serverCPU(ctx, pool) - pgBefore) / per1k
	res.rCPU = (redisCPU(ctx, rdb) - redisBefore) / per1k
	if prof != nil {
		prof.wait()
		// The relay's allocations since its start, by call site: what the
		// allocs/event and bytes/event figures are made of.
		d.saveProfile("allocs", filepath.Join(*profile, tag+".allocs.pprof"))
		if statements {
			dumpPgStatStatements(ctx, pool, filepath.Join(*profile, tag+".pg_stat_statements.txt"))
		}
		stats, err := rdb.Info(ctx, "commandstats").Result()
		check(err)
		check(os.WriteFile(filepath.Join(*profile, tag+".redis_commandstats.txt"), []byte(stats), 0o644))
	}
	return res
}

// drainBare times peer.BareDrain on the backlog drainOutboxd gives the
// relay: a fresh database migrated by bin, the same rows, the same
// CHECKPOINT before the insert and VACUUM ANALYZE after it (or neither,
// with -as-written); events/s from the protocol's first fetch to its last
// mark, and the CPU seconds per 1,000 events of the bench's process (the
// protocol's loop, in relayCPU), Postgres and Redis over that time.
func drainBare(ctx context.Context, bin string, batch, rows int) drainResult {
	load := loadAvg()
	r := newRun(ctx, bin)
	defer r.done()
	pool, err := pgxpool.New(ctx, r.dsn)
	check(err)
	defer pool.Close()
	tableAutovacuum(ctx, pool)
	if !*asWritten {
		_, err = pool.Exec(ctx, `CHECKPOINT`)
		check(err)
	}
	insertBacklog(ctx, pool, rows)
	if !*asWritten {
		_, err = pool.Exec(ctx, `VACUUM ANALYZE outbox`)
		check(err)
	}
	pgBefore, redisBefore, selfBefore := serverCPU(ctx, pool), redisCPU(ctx, r.rdb), selfCPU()
	d, err := peer.BareDrain(ctx, pool, r.rdb, r.prefix, batch, rows)
	check(err)
	per1k := float64(rows) / 1000
	return drainResult{
		load: load, perSec: float64(rows) / d.Seconds(),
		relayCPU: (selfCPU() - selfBefore) / per1k,
		pgCPU:    (serverCPU(ctx, pool) - pgBefore) / per1k,
		rCPU:     (redisCPU(ctx, r.rdb) - redisBefore) / per1k,
	}
}

// ---- latency ----

func latencyRuns(ctx context.Context, bins []build) {
	modes := tracingModes(*tracing)
	var sink *otlpSink
	if slices.Contains(modes, "on") {
		sink = startOTLPSink()
	}
	waits := []string{""}
	if *gapWaits != "" {
		waits = strings.Split(*gapWaits, ",")
	}
	type key struct{ bin, wait, mode string }
	all := map[key][]latency{}
	cpu := map[string][]float64{} // relay CPU s/1k events per label
	var labels []string
	for r := range *runs {
		for _, bin := range bins {
			for _, w := range waits {
				w = strings.TrimSpace(w)
				for _, mode := range modes {
					var extra, env []string
					label := bin.label
					if w != "" {
						extra = []string{"poller.gap_wait=" + w}
						label += " gap_wait " + w
					}
					if mode != "" {
						label, env = label+" tracing "+mode, tracingEnv(mode, sink)
					}
					var spans0, bad0 int64
					if sink != nil {
						spans0, bad0 = sink.spans.Load(), sink.bad.Load()
					}
					q := latencyOnce(ctx, use(bin), extra, env)
					all[key{bin.label, w, mode}] = append(all[key{bin.label, w, mode}], q)
					recv, traced := "", ""
					if *latWebhook {
						recv = fmt.Sprintf("; commit → received p50 %.2f p99 %.2f max %.2f ms", q.recvP50, q.recvP99, q.recvMax)
					}
					if mode == "on" {
						spans := sink.spans.Load() - spans0
						traced = fmt.Sprintf("; spans received %d (%.2f per event, %d bad exports)", spans, float64(spans)/float64(q.events), sink.bad.Load()-bad0)
					}
					fmt.Printf("run %d %s: %d ev/s x%d per tx, %s (achieved %.0f ev/s), commit → marked p50 %.2f ms  p95 %.2f ms  p99 %.2f ms  max %.2f ms (%d events); producer tx p50 %.2f p99 %.2f max %.2f ms%s; relay CPU s/1k events %.4f%s; load %s; outbox indexes %.1f MiB at the end\n",
						r+1, label, *rate, *perTx, latencyShape(), q.achieved, q.p50, q.p95, q.p99, q.max, q.n, q.prodP50, q.prodP99, q.prodMax, recv, q.relayCPU, traced, q.load, q.indexMiB)
					fmt.Printf("    %s order: outboxd_late_commits_total %.0f, outboxd_gaps_given_up_total %.0f, %s after a later event of their aggregate %d%s\n",
						label, q.lateCommits, q.gapsGivenUp, q.orderWord, q.outOfOrder, q.longWord)
					for i, w := range q.windows {
						fmt.Printf("    %s window %d (%v–%v): commit → marked p50 %.2f  p95 %.2f  p99 %.2f  max %.2f ms (%d events); producer tx p99 %.2f max %.2f ms\n",
							label, i+1, time.Duration(i)**window, time.Duration(i+1)**window, w.p50, w.p95, w.p99, w.max, w.n, q.prodWindows[i].p99, q.prodWindows[i].max)
					}
					for _, c := range q.checkpoints {
						fmt.Printf("    %s %s (the windows' clock)\n", label, c)
					}
					for _, p := range q.pauses {
						fmt.Printf("    %s %s (the producers' clock)\n", label, p)
					}
					if _, seen := cpu[label]; !seen {
						labels = append(labels, label)
					}
					cpu[label] = append(cpu[label], q.relayCPU)
				}
			}
		}
	}
	// One row per build, gap_wait and tracing mode: each run's figure, in run order.
	seen := "out of order, marked (an upper bound)"
	if *latWebhook {
		seen = "out of order, received"
	}
	fmt.Printf("\n%d ev/s, %s, %d aggregates\n\n| build | gap_wait | tracing | p50 ms | p99 ms | late commits (relay) | %s | gaps given up | achieved ev/s | load |\n|---|---|---|---|---|---|---|---|---|---|\n",
		*rate, latencyShape(), *slowAggs, seen)
	for _, bin := range bins {
		for _, w := range waits {
			w = strings.TrimSpace(w)
			for _, mode := range modes {
				xs := all[key{bin.label, w, mode}]
				col := func(f func(latency) string) string {
					var out []string
					for _, x := range xs {
						out = append(out, f(x))
					}
					return strings.Join(out, ", ")
				}
				fmt.Printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", bin.label, cmp.Or(w, "default"), cmp.Or(mode, "as set"),
					col(func(x latency) string { return fmt.Sprintf("%.1f", x.p50) }),
					col(func(x latency) string { return fmt.Sprintf("%.1f", x.p99) }),
					col(func(x latency) string { return fmt.Sprintf("%.0f", x.lateCommits) }),
					col(func(x latency) string { return strconv.Itoa(x.outOfOrder) }),
					col(func(x latency) string { return fmt.Sprintf("%.0f", x.gapsGivenUp) }),
					col(func(x latency) string { return fmt.Sprintf("%.0f", x.achieved) }),
					col(func(x latency) string { return strings.Fields(x.load)[0] }))
			}
		}
	}
	if len(modes) > 1 {
		for _, l := range labels {
			xs := cpu[l]
			fmt.Printf("relay CPU s/1k events, %s: %.4f / %.4f / %.4f (min/median/max over %d runs)\n", l, slices.Min(xs), median(xs), slices.Max(xs), len(xs))
		}
	}
}

// latencyShape says how the load was produced, for the result line.
func latencyShape() string {
	var parts []string
	if *producers > 0 {
		parts = append(parts, fmt.Sprintf("%d racing producers (BEGIN, INSERT, %vCOMMIT)", *producers, holdWord()))
	} else {
		parts = append(parts, "one-statement transactions")
	}
	if *longTx > 0 {
		parts = append(parts, fmt.Sprintf("one more producer holding each transaction %v after its INSERT", *longTx))
	}
	if *holdSnapshot {
		parts = append(parts, "REPEATABLE READ snapshot held")
	} else {
		parts = append(parts, "no snapshot held")
	}
	parts = append(parts, "autovacuum "+autovacuumWord())
	return strings.Join(parts, ", ")
}

func holdWord() string {
	if *txHold > 0 {
		return fmt.Sprintf("%v, ", *txHold)
	}
	return ""
}

type quantiles struct {
	p50, p95, p99, max float64
	n                  int
}

func quantilesOf(xs []float64) quantiles {
	if len(xs) == 0 {
		return quantiles{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	q := func(p float64) float64 { return s[min(len(s)-1, int(p*float64(len(s))))] }
	return quantiles{q(0.50), q(0.95), q(0.99), s[len(s)-1], len(s)}
}

type latency struct {
	achieved, p50, p95, p99, max float64
	n                            int
	// The producers' own transaction (one round trip, or BEGIN to COMMIT
	// with -producers): a stall of the machine shows here as well as in the
	// relay's latency.
	prodP50, prodP99, prodMax float64
	// With -webhook: commit → the receiver's first request for the event.
	recvP50, recvP99, recvMax float64
	// With -window: commit → marked per window of commit time, and the
	// producers' own transaction time in the same windows.
	windows, prodWindows []quantiles
	// Checkpoints the server finished during the run, in s from the
	// measured start (the windows' clock).
	checkpoints []checkpointSeen
	load        string
	indexMiB    float64 // the outbox table's indexes when the run ended
	relayCPU    float64 // the relay's CPU seconds per 1,000 events, start-up included
	events      int     // events produced (warm-up included)
	// What became of per-aggregate order: the relay's counters at the end,
	// and the events the bench saw go after a later event of their
	// aggregate (marked, or with -webhook received).
	lateCommits, gapsGivenUp float64
	outOfOrder               int
	orderWord                string   // "marked" or "received"
	longWord                 string   // with -long-tx: its events' latency
	pauses                   []string // with -pause: what each cost (pauseRecovery)
}

// commit is one producer transaction: its ids, when COMMIT returned, and
// how long the transaction took.
type commit struct {
	ids  []int64
	at   time.Time
	took time.Duration
}

// latencyOnce is one latency run of bin; extra are --set pairs for the
// relay; env, when not nil, is the relay's environment (tracingEnv).
func latencyOnce(ctx context.Context, bin string, extra, env []string) latency {
	load := loadAvg()
	r := newRun(ctx, bin)
	defer r.done()
	dsn, prefix := r.dsn, r.prefix
	cfg, err := pgxpool.ParseConfig(dsn)
	check(err)
	cfg.MaxConns = int32(max(16, *producers) + 2) // + the -long-tx producer and the checks at the end
	if *prodAsync {
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	check(err)
	defer pool.Close()
	tableAutovacuum(ctx, pool)
	if *holdSnapshot {
		release := holdSnapshotOpen(ctx, dsn)
		defer release()
	}
	sink := []string{noopSink}
	var got *arrivals
	if *latWebhook {
		var stop func()
		got, sink, stop = arrivalReceiver()
		defer stop()
	}
	d := startDaemon(ctx, bin, dsn, prefix, *latBatch, false, append(sink, extra...), env...)
	defer d.stop()
	d.waitLeader()

	// Open loop: transaction i starts at start + i·interval whatever the
	// others do; the first second warms up and is not measured.
	k := max(*perTx, 1)
	interval := time.Second * time.Duration(k) / time.Duration(*rate)
	warm := *rate / k
	n := warm + int(steadyFor.Seconds()*float64(*rate))/k
	commits := make([]commit, n)
	start := time.Now()
	obs := observe(ctx, dsn, start)
	longCtx, stopLong := context.WithCancel(ctx)
	var long []commit
	var longWG sync.WaitGroup
	if *longTx > 0 {
		longWG.Go(func() { long = longTransactions(longCtx, pool, n) })
	}
	ps := parsePauses(*pauses)
	var pauseWG sync.WaitGroup
	pauseWG.Go(func() { runPauses(ctx, pool, ps, start, d.cmd.Process.Pid) })
	if *producers > 0 {
		racingProducers(ctx, pool, commits, start, interval, k)
	} else {
		oneStatementProducers(ctx, pool, commits, start, interval, k)
	}
	achieved := float64(n*k) / time.Since(start).Seconds()
	pauseWG.Wait()
	obs.stop()
	stopLong()
	longWG.Wait()
	for d.dispatched() < float64(n*k+len(long)) {
		time.Sleep(20 * time.Millisecond)
		d.checkAlive()
	}
	relayCPU := d.cpuSeconds() / (float64(n*k) / 1000)
	lateCommits, gapsGivenUp := d.metricSum("outboxd_late_commits_total"), d.metricSum("outboxd_gaps_given_up_total")
	marked := map[int64]time.Time{}
	res, err := pool.Query(ctx, `SELECT id, dispatched_at FROM outbox`)
	check(err)
	var id int64
	var at time.Time
	_, err = pgx.ForEachRow(res, []any{&id, &at}, func() error { marked[id] = at; return nil })
	check(err)
	var indexBytes int64
	check(pool.QueryRow(ctx, `SELECT pg_indexes_size('outbox')`).Scan(&indexBytes))
	var lat, prod, recv []float64
	var perWindow, prodPerWindow [][]float64
	measured := start.Add(time.Duration(warm) * interval)
	var dump strings.Builder
	var pauseAt, pauseLat []float64 // every event's commit (s from start) and latency, with -pause
	for _, c := range commits[warm:] {
		took := float64(c.took.Microseconds()) / 1000
		prod = append(prod, took)
		w := -1 // the commit's window, with -window
		if *window > 0 {
			// The last commits can fall a little past -for: they count
			// in the last window, not in one of their own.
			last := max(1, int((*steadyFor+*window-1) / *window)) - 1
			w = min(max(0, int(c.at.Sub(measured) / *window)), last)
			for len(perWindow) <= w {
				perWindow, prodPerWindow = append(perWindow, nil), append(prodPerWindow, nil)
			}
			prodPerWindow[w] = append(prodPerWindow[w], took)
		}
		for _, id := range c.ids {
			if got != nil {
				recv = append(recv, float64(got.first(id).Sub(c.at).Microseconds())/1000)
			}
			l := float64(marked[id].Sub(c.at).Microseconds()) / 1000
			lat = append(lat, l)
			if w >= 0 {
				perWindow[w] = append(perWindow[w], l)
			}
			fmt.Fprintf(&dump, "%.4f %.3f\n", c.at.Sub(start).Seconds(), l)
			if len(ps) > 0 {
				pauseAt, pauseLat = append(pauseAt, c.at.Sub(start).Seconds()), append(pauseLat, l)
			}
		}
	}
	if *latDump != "" {
		stem := fmt.Sprintf("%s.%d", *latDump, time.Now().UnixNano())
		check(os.WriteFile(stem+".txt", []byte(dump.String()), 0o644))
		obs.write(stem)
	}
	all, p, rv := quantilesOf(lat), quantilesOf(prod), quantilesOf(recv)
	out := latency{achieved: achieved, p50: all.p50, p95: all.p95, p99: all.p99, max: all.max, n: all.n,
		prodP50: p.p50, prodP99: p.p99, prodMax: p.max, load: load, indexMiB: float64(indexBytes) / (1 << 20), relayCPU: relayCPU, events: n * k}
	if len(recv) > 0 {
		out.recvP50, out.recvP99, out.recvMax = rv.p50, rv.p99, rv.max
	}
	for i, w := range perWindow {
		out.windows = append(out.windows, quantilesOf(w))
		out.prodWindows = append(out.prodWindows, quantilesOf(prodPerWindow[i]))
	}
	for _, c := range obs.checkpoints {
		c.started -= measured.Sub(start).Seconds()
		c.done -= measured.Sub(start).Seconds()
		out.checkpoints = append(out.checkpoints, c)
	}
	out.lateCommits, out.gapsGivenUp = lateCommits, gapsGivenUp
	for _, p := range ps {
		out.pauses = append(out.pauses, pauseRecovery(p, pauseAt, pauseLat))
	}
	out.orderWord, out.outOfOrder = "marked", markedOutOfOrder(ctx, pool)
	if got != nil {
		out.orderWord = fmt.Sprintf("marked %d, received", out.outOfOrder)
		out.outOfOrder = receivedOutOfOrder(ctx, pool, got)
	}
	if len(long) > 0 {
		var ls []float64
		for _, c := range long {
			ls = append(ls, float64(marked[c.ids[0]].Sub(c.at).Microseconds())/1000)
		}
		lq := quantilesOf(ls)
		out.longWord = fmt.Sprintf("; %d long transactions, their events commit → marked p50 %.2f max %.2f ms", lq.n, lq.p50, lq.max)
	}
	return out
}

// markedOutOfOrder counts the events marked delivered after a later event
// of their aggregate (a batch's marks share one timestamp, so only a later
// batch counts). An upper bound: the marks of batches in flight together
// are written in transactions whose now() can come in the other order
// (seen: 4 marked against 0 received by the -webhook receiver, and 0
// late commits counted, in one run), so -webhook is the order to trust.
func markedOutOfOrder(ctx context.Context, pool *pgxpool.Pool) int {
	var n int
	check(pool.QueryRow(ctx, `SELECT count(*) FROM (
		SELECT dispatched_at, min(dispatched_at) OVER (PARTITION BY aggregate_type, aggregate_id ORDER BY id DESC
		  ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS later
		FROM outbox) x WHERE later < dispatched_at`).Scan(&n))
	return n
}

// receivedOutOfOrder counts the events the webhook receiver first got
// after a later event of their aggregate.
func receivedOutOfOrder(ctx context.Context, pool *pgxpool.Pool, got *arrivals) int {
	agg := map[int64]string{}
	rows, err := pool.Query(ctx, `SELECT id, aggregate_type || '/' || aggregate_id FROM outbox`)
	check(err)
	var id int64
	var a string
	_, err = pgx.ForEachRow(rows, []any{&id, &a}, func() error { agg[id] = a; return nil })
	check(err)
	got.mu.Lock()
	defer got.mu.Unlock()
	highest, n := map[string]int64{}, 0
	for _, id := range got.seq {
		if id < highest[agg[id]] {
			n++
		}
		highest[agg[id]] = max(highest[agg[id]], id)
	}
	return n
}

// longTransactions is the -long-tx producer: one transaction after
// another, each inserting one event and committing -long-tx later, until
// ctx ends (the other producers are through); the last one still commits.
// Its events go to the same aggregates as the others' (sequence numbers
// from n up).
func longTransactions(ctx context.Context, pool *pgxpool.Pool, n int) []commit {
	conn, err := pool.Acquire(context.WithoutCancel(ctx))
	check(err)
	defer conn.Release()
	var out []commit
	for i := n; ctx.Err() == nil; i++ {
		began := time.Now()
		tx, err := conn.Begin(context.WithoutCancel(ctx))
		check(err)
		rows, err := tx.Query(context.WithoutCancel(ctx), insertEvents, insertArgs(i, 1))
		check(err)
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		check(err)
		select {
		case <-time.After(*longTx):
		case <-ctx.Done():
		}
		check(tx.Commit(context.WithoutCancel(ctx)))
		now := time.Now()
		out = append(out, commit{ids, now, now.Sub(began)})
	}
	return out
}

// oneStatementProducers commits each transaction as one INSERT (its own
// transaction: one round trip, as a pgbench producer would do, so the load
// generator takes as little of the two cores as it can), up to 16 at once.
func oneStatementProducers(ctx context.Context, pool *pgxpool.Pool, commits []commit, start time.Time, interval time.Duration, k int) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range commits {
		time.Sleep(time.Until(start.Add(time.Duration(i) * interval)))
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			began := time.Now()
			rows, err := pool.Query(ctx, insertEvents, insertArgs(i, k))
			check(err)
			ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
			check(err)
			now := time.Now()
			commits[i] = commit{ids, now, now.Sub(began)}
		})
	}
	wg.Wait()
}

// racingProducers runs -producers producers, each on its own connection,
// producer p taking transactions p, p+K, p+2K, ... at their open-loop start
// times (or at once when it is behind). Each transaction is BEGIN, INSERT
// (taking its ids), -tx-hold, COMMIT: ids are taken in one order and become
// visible in another, the race a relay reading by id has to handle.
func racingProducers(ctx context.Context, pool *pgxpool.Pool, commits []commit, start time.Time, interval time.Duration, k int) {
	var wg sync.WaitGroup
	for p := range *producers {
		wg.Go(func() {
			conn, err := pool.Acquire(ctx)
			check(err)
			defer conn.Release()
			for i := p; i < len(commits); i += *producers {
				time.Sleep(time.Until(start.Add(time.Duration(i) * interval)))
				began := time.Now()
				tx, err := conn.Begin(ctx)
				check(err)
				rows, err := tx.Query(ctx, insertEvents, insertArgs(i, k))
				check(err)
				ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
				check(err)
				if *txHold > 0 {
					time.Sleep(*txHold)
				}
				check(tx.Commit(ctx))
				now := time.Now()
				commits[i] = commit{ids, now, now.Sub(began)}
			}
		})
	}
	wg.Wait()
}

// insertEvents writes @events events of transaction @tx over @aggregates
// aggregates (insertArgs),
// picked by a hash: transactions open at the same time may then write the
// same aggregate (with a round robin, neighbours never would, and racing
// producers could not break an aggregate's order).
const insertEvents = `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
	SELECT 'deal', mod(hashint4(@tx::int * 7 + g)::bigint + 2147483648, @aggregates::int)::text, 'deal.funded',
	  jsonb_build_object('seq', @tx::int, 'pad', repeat('x', @pad))
	FROM generate_series(1, @events::int) g RETURNING id`

// insertArgs are insertEvents' parameters: events events of transaction tx.
func insertArgs(tx, events int) pgx.NamedArgs {
	return pgx.NamedArgs{"tx": tx, "events": events, "pad": payloadPad, "aggregates": *slowAggs}
}

// ---- the daemon ----

type daemon struct {
	cmd     *exec.Cmd
	addr    string
	started time.Time
	exited  chan struct{}
	logs    *tail
}

// startDaemon runs `outboxd run` as a user would, with the sink that the
// --set pairs in sink select, and returns once its HTTP port answers.
// startDaemon runs `outboxd run` on the run's database and prefix; env,
// when given, is its whole environment (default: the bench's).
func startDaemon(ctx context.Context, bin, dsn, prefix string, batch int, pprof bool, sink []string, env ...string) *daemon {
	addr := freePort()
	dsn, pooled := throughBouncer(ctx, dsn)
	sink = append(pooled, sink...)
	args := []string{"run",
		"--set", "postgres.dsn=" + dsn + dsnSuffix(), "--set", "redis.addrs=" + *redisAddr, "--set", "redis.key_prefix=" + prefix,
		"--set", "poller.batch_size=" + strconv.Itoa(batch),
		"--set", "http.addr=" + addr, "--set", "http.pprof=" + strconv.FormatBool(pprof),
		"--set", "log.level=warn", "--set", "reconcile.schedule=@every 1h",
	}
	for _, s := range sink {
		args = append(args, "--set", s)
	}
	for _, s := range strings.Split(*sets, ",") {
		if s = strings.TrimSpace(s); s != "" {
			args = append(args, "--set", s)
		}
	}
	for _, s := range buildSets {
		args = append(args, "--set", s)
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env // nil: the bench's environment
	logs := &tail{}
	cmd.Stdout, cmd.Stderr = logs, logs
	d := &daemon{cmd: cmd, addr: addr, exited: make(chan struct{}), logs: logs}
	d.started = time.Now()
	check(cmd.Start())
	go func() { _ = cmd.Wait(); close(d.exited) }()
	atExit(d.stop) // an interrupted bench leaves no relay running
	for {
		d.checkAlive()
		if resp, err := http.Get("http://" + addr + "/livez"); err == nil {
			resp.Body.Close()
			return d
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (d *daemon) checkAlive() {
	select {
	case <-d.exited:
		check(fmt.Errorf("outboxd exited: %v\n%s", d.cmd.ProcessState, d.logs))
	default:
	}
}

func (d *daemon) stop() {
	_ = d.cmd.Process.Signal(os.Interrupt)
	select {
	case <-d.exited:
	case <-time.After(30 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.exited
	}
}

// metric reads one unlabelled sample from /metrics.
func (d *daemon) metric(name string) float64 {
	for _, line := range d.metricLines() {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}

// metricLines is one scrape of /metrics (none when it does not answer).
func (d *daemon) metricLines() []string {
	resp, err := http.Get("http://" + d.addr + "/metrics")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var out []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

// dispatched sums outboxd_dispatched_total over its series (one per
// destination label; a single unlabelled one from builds before routing).
func (d *daemon) dispatched() float64 {
	var sum float64
	for _, line := range d.metricLines() {
		if rest, ok := strings.CutPrefix(line, "outboxd_dispatched_total"); ok && (rest[0] == ' ' || rest[0] == '{') {
			f, _ := strconv.ParseFloat(rest[strings.LastIndexByte(rest, ' ')+1:], 64)
			sum += f
		}
	}
	return sum
}

func (d *daemon) waitLeader() {
	for d.metric(`outboxd_lock_held{lock="lock:outbox:poller"}`) < 1 {
		d.checkAlive()
		time.Sleep(10 * time.Millisecond)
	}
}

// peakRSSMiB is the process' VmHWM.
func (d *daemon) peakRSSMiB() float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.cmd.Process.Pid))
	check(err)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			return kb / 1024
		}
	}
	return 0
}

func (d *daemon) cpuSeconds() float64 { return pidCPU(d.cmd.Process.Pid) }

type profileFetch struct{ done chan struct{} }

func (p *profileFetch) wait() { <-p.done }

// cpuProfile records the relay for the drain's expected length.
func (d *daemon) cpuProfile(path string) *profileFetch {
	p := &profileFetch{done: make(chan struct{})}
	go func() {
		defer close(p.done)
		d.saveProfile("profile?seconds="+strconv.Itoa(max(1, int(profileFor.Seconds()))), path)
	}()
	return p
}

// saveProfile writes the relay's pprof profile name (allocs, heap,
// profile?seconds=N) to path.
func (d *daemon) saveProfile(name, path string) {
	resp, err := http.Get("http://" + d.addr + "/debug/pprof/" + name)
	check(err)
	defer resp.Body.Close()
	f, err := os.Create(path)
	check(err)
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	check(err)
}

// tail keeps the last 8 KiB a process wrote, for error messages.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > 8<<10 {
		t.buf = t.buf[len(t.buf)-8<<10:]
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// ---- measuring Postgres and Redis ----

// serverCPU sums user+system CPU seconds of the Postgres server pool is
// connected to: its postmaster and every process it started (backends,
// walwriter, checkpointer, ...), not those of other servers on the machine
// (a private server beside the shared one: the shared one's work for other
// users is not the relay's). Backends that exit between two readings lose
// their share; the relay's stay connected. The server must run here.
//
// With -pg-cpu database, only the backends connected to pool's database
// are summed: on a server others use meanwhile, their work is not the
// relay's (the server's shared processes, the WAL writer's share, are then
// left out too).
func serverCPU(ctx context.Context, pool *pgxpool.Pool) float64 {
	if *pgCPUScope == "database" {
		rows, err := pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database()`)
		check(err)
		pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		check(err)
		return sumCPU(func(pid int) bool { return slices.Contains(pids, int32(pid)) })
	}
	var backend int
	check(pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend))
	postmaster := parentPID(backend)
	return sumCPU(func(pid int) bool { return pid == postmaster || parentPID(pid) == postmaster })
}

// sumCPU sums pidCPU over the running processes that match.
func sumCPU(match func(pid int) bool) float64 {
	ents, err := os.ReadDir("/proc")
	check(err)
	total := 0.0
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil && match(pid) {
			total += pidCPU(pid)
		}
	}
	return total
}

// statFields are the fields of /proc/<pid>/stat after the command name
// (state first), nil when the process is gone.
func statFields(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	s := string(b)
	return strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
}

// parentPID is a process's parent (0 if gone).
func parentPID(pid int) int {
	f := statFields(pid)
	if f == nil {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// pidCPU reads utime+stime from /proc/<pid>/stat (clock ticks of 100 Hz).
func pidCPU(pid int) float64 {
	f := statFields(pid)
	if f == nil {
		return 0
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100
}

func redisCPU(ctx context.Context, rdb *redis.Client) float64 {
	info, err := rdb.Info(ctx, "cpu").Result()
	check(err)
	total := 0.0
	for _, line := range strings.Split(info, "\r\n") {
		for _, k := range []string{"used_cpu_sys:", "used_cpu_user:"} {
			if v, ok := strings.CutPrefix(line, k); ok {
				f, _ := strconv.ParseFloat(v, 64)
				total += f
			}
		}
	}
	return total
}

func resetPgStatStatements(ctx context.Context, pool *pgxpool.Pool) bool {
	if _, err := pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		return false
	}
	_, err := pool.Exec(ctx, `SELECT pg_stat_statements_reset()`)
	if err != nil {
		fmt.Fprintf(os.Stderr, "pg_stat_statements unavailable (shared_preload_libraries?): %v\n", err)
	}
	return err == nil
}

func dumpPgStatStatements(ctx context.Context, pool *pgxpool.Pool, path string) {
	rows, err := pool.Query(ctx, `
SELECT calls, round(total_exec_time::numeric, 1)::float8, round(mean_exec_time::numeric, 3)::float8, rows,
       shared_blks_hit, shared_blks_read, shared_blks_dirtied, wal_records, wal_bytes::float8,
       left(regexp_replace(query, '\s+', ' ', 'g'), 160)
FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
ORDER BY total_exec_time DESC LIMIT 15`)
	check(err)
	var b strings.Builder
	b.WriteString("calls\ttotal_ms\tmean_ms\trows\tblks_hit\tblks_read\tblks_dirtied\twal_records\twal_bytes\tquery\n")
	for rows.Next() {
		vals, err := rows.Values()
		check(err)
		for i, v := range vals {
			if i > 0 {
				b.WriteByte('\t')
			}
			fmt.Fprint(&b, v)
		}
		b.WriteByte('\n')
	}
	check(rows.Err())
	check(os.WriteFile(path, []byte(b.String()), 0o644))
}

// ---- environment ----

func runCmd(bin string, args ...string) {
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		check(fmt.Errorf("outboxd %s: %w\n%s", strings.Join(args, " "), err, out))
	}
}

func freePort() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	defer ln.Close()
	return ln.Addr().String()
}

// freePortNumber is freePort's port.
func freePortNumber() int {
	_, port, err := net.SplitHostPort(freePort())
	check(err)
	n, err := strconv.Atoi(port)
	check(err)
	return n
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// mmm formats min / median / max.
func mmm(xs []float64) string {
	return fmt.Sprintf("%.0f / %.0f / %.0f", slices.Min(xs), median(xs), slices.Max(xs))
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "blackbox:", err)
		runAtExit()
		os.Exit(1)
	}
}

func dsnSuffix() string {
	if *dsnParams == "" {
		return ""
	}
	return "&" + *dsnParams
}
