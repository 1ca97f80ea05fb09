package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Correlating the latency tail with what the server does: -pg-set
// configures the private server (log_checkpoints, checkpoint_timeout, ...),
// -poke runs statements at known times of a latency run (CHECKPOINT,
// ANALYZE outbox, VACUUM outbox) so their effect can be told from the rest
// of the run, and -sample-waits records what the relay's sessions wait on.
// With -dump PREFIX, each run writes PREFIX.<n>.events.txt (the dump), and
// beside it PREFIX.<n>.pokes.txt, PREFIX.<n>.waits.txt and, on a private
// server, PREFIX.<n>.pglog.txt, all on the dump's clock (s from the run's
// start; the server log carries the start's wall clock in its first line).
var (
	pgSets      = flag.String("pg-set", "", "with -pg private-autovacuum: ALTER SYSTEM SET pairs, ';'-separated (e.g. checkpoint_timeout=30s;log_checkpoints=on;log_autovacuum_min_duration=0), applied by a reload")
	pokeList    = flag.String("poke", "", "latency: statements run in the run's database at offsets from the producers' start, ';'-separated OFFSET=SQL (e.g. 20s=CHECKPOINT;40s=ANALYZE outbox); with every=D after the offset (20s/30s=ANALYZE outbox) it repeats each D until the producers stop")
	sampleWaits = flag.Duration("sample-waits", 0, "latency: sample the relay's active sessions in pg_stat_activity (wait event, query start) this often, into the -dump files")
)

// privateLog is the private server's log file, when there is one.
var privateLog string

// applyPgSets runs -pg-set on the private server.
func applyPgSets(ctx context.Context, dsn string) {
	if *pgSets == "" {
		return
	}
	if *pgMode != "private-autovacuum" {
		check(fmt.Errorf("-pg-set needs -pg private-autovacuum: the shared server is not ours to reconfigure"))
	}
	conn, err := pgx.Connect(ctx, dsn)
	check(err)
	defer conn.Close(ctx)
	for _, kv := range strings.Split(*pgSets, ";") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			check(fmt.Errorf("-pg-set %q: want key=value", kv))
		}
		_, err := conn.Exec(ctx, fmt.Sprintf("ALTER SYSTEM SET %s = %s", pgx.Identifier{k}.Sanitize(), quoteLiteral(v)))
		check(err)
	}
	_, err = conn.Exec(ctx, `SELECT pg_reload_conf()`)
	check(err)
	fmt.Printf("blackbox: private server set %s\n", *pgSets)
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

type poke struct {
	at, every time.Duration
	sql       string
}

func parsePokes() []poke {
	var out []poke
	for _, s := range strings.Split(*pokeList, ";") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		when, sql, ok := strings.Cut(s, "=")
		if !ok {
			check(fmt.Errorf("-poke %q: want OFFSET=SQL", s))
		}
		var p poke
		at, every, repeat := strings.Cut(when, "/")
		var err error
		p.at, err = time.ParseDuration(at)
		check(err)
		if repeat {
			p.every, err = time.ParseDuration(every)
			check(err)
		}
		p.sql = sql
		out = append(out, p)
	}
	return out
}

// observer runs the pokes, the wait sampler and the checkpoint watch of
// one latency run.
type observer struct {
	start time.Time
	mu    sync.Mutex
	pokes strings.Builder // "start end sql" per poke, s from start
	waits strings.Builder // "t pid wait_event_type wait_event query_age_ms query" per sample
	// Every checkpoint the server finished during the run, so a latency
	// window can be read beside the checkpoint that overlapped it.
	checkpoints []checkpointSeen
	wg          sync.WaitGroup
	cancel      context.CancelFunc
}

// observe starts the run's pokes and sampler; stop ends them.
func observe(ctx context.Context, dsn string, start time.Time) *observer {
	ctx, cancel := context.WithCancel(ctx)
	o := &observer{start: start, cancel: cancel}
	for _, p := range parsePokes() {
		o.wg.Go(func() { o.runPoke(ctx, dsn, p) })
	}
	if *sampleWaits > 0 {
		o.wg.Go(func() { o.sample(ctx, dsn) })
	}
	o.wg.Go(func() { o.watchCheckpoints(ctx, dsn) })
	return o
}

func (o *observer) stop() {
	o.cancel()
	o.wg.Wait()
}

func (o *observer) since() float64 { return time.Since(o.start).Seconds() }

func (o *observer) runPoke(ctx context.Context, dsn string, p poke) {
	conn, err := pgx.Connect(ctx, dsn)
	check(err)
	defer conn.Close(context.WithoutCancel(ctx))
	next := p.at
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(o.start.Add(next))):
		}
		t0 := o.since()
		_, err := conn.Exec(ctx, p.sql)
		if ctx.Err() != nil {
			return
		}
		check(err)
		o.mu.Lock()
		fmt.Fprintf(&o.pokes, "%.4f %.4f %s\n", t0, o.since(), p.sql)
		o.mu.Unlock()
		if p.every <= 0 {
			return
		}
		next += p.every
	}
}

// sample records the relay's sessions that are running a statement: the
// wait event they are in, if any, and how long the statement has run.
func (o *observer) sample(ctx context.Context, dsn string) {
	everyTick(ctx, dsn, *sampleWaits, func(conn *pgx.Conn) error {
		rows, err := conn.Query(ctx, `SELECT pid, COALESCE(wait_event_type, '-'), COALESCE(wait_event, '-'),
  (extract(epoch FROM clock_timestamp() - query_start) * 1000)::float8, left(regexp_replace(query, '\s+', ' ', 'g'), 60)
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND state = 'active' AND backend_type = 'client backend'`)
		if err != nil {
			return err
		}
		t := o.since()
		var pid int32
		var wt, we, q string
		var age float64
		_, err = pgx.ForEachRow(rows, []any{&pid, &wt, &we, &age, &q}, func() error {
			o.mu.Lock()
			fmt.Fprintf(&o.waits, "%.4f %d %s %s %.1f %s\n", t, pid, wt, we, age, q)
			o.mu.Unlock()
			return nil
		})
		return err
	})
}

// everyTick runs f on a connection of its own every period until ctx
// ends; an error of f ends the bench, unless ctx ended meanwhile.
func everyTick(ctx context.Context, dsn string, period time.Duration, f func(*pgx.Conn) error) {
	conn, err := pgx.Connect(ctx, dsn)
	check(err)
	defer conn.Close(context.WithoutCancel(ctx))
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		err := f(conn)
		if ctx.Err() != nil {
			return
		}
		check(err)
	}
}

// checkpointSeen is one checkpoint: when it started (the checkpoint
// record's time, whole seconds) and when the bench saw it finished, both in
// s from the run's start. What asked for it (checkpoint_timeout, WAL,
// CHECKPOINT) is in the server's log with log_checkpoints on: the
// checkpointer's counters in pg_stat_bgwriter lag the control file, so
// they cannot tell it here.
type checkpointSeen struct {
	started, done float64
}

func (c checkpointSeen) String() string {
	return fmt.Sprintf("checkpoint started %+.0f s, finished by %+.0f s", c.started, c.done)
}

// watchCheckpoints polls the server's last checkpoint once a second. A
// checkpoint shows only once it finished (pg_control_checkpoint), so one
// still running when the run ends is not listed; nor one that finished
// before the first poll.
func (o *observer) watchCheckpoints(ctx context.Context, dsn string) {
	const q = `SELECT extract(epoch FROM checkpoint_time)::float8 FROM pg_control_checkpoint()`
	var last float64
	everyTick(ctx, dsn, time.Second, func(conn *pgx.Conn) error {
		var at float64
		if err := conn.QueryRow(ctx, q).Scan(&at); err != nil {
			return err
		}
		if last != 0 && at != last {
			start := float64(o.start.UnixMicro()) / 1e6
			o.mu.Lock()
			o.checkpoints = append(o.checkpoints, checkpointSeen{started: at - start, done: o.since()})
			o.mu.Unlock()
		}
		last = at
		return nil
	})
}

// write puts the run's files beside the dump (-dump PREFIX, run n).
func (o *observer) write(prefix string) {
	if prefix == "" {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.pokes.Len() > 0 {
		check(os.WriteFile(prefix+".pokes.txt", []byte(o.pokes.String()), 0o644))
	}
	if o.waits.Len() > 0 {
		check(os.WriteFile(prefix+".waits.txt", []byte(o.waits.String()), 0o644))
	}
	if privateLog != "" {
		b, err := os.ReadFile(privateLog)
		check(err)
		head := fmt.Sprintf("# run start %s (unix %.4f)\n", o.start.UTC().Format("2006-01-02 15:04:05.000 MST"), float64(o.start.UnixMicro())/1e6)
		check(os.WriteFile(prefix+".pglog.txt", append([]byte(head), b...), 0o644))
	}
}
