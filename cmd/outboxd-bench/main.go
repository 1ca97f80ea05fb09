// Command outboxd-bench measures the relay on this machine against real
// Postgres and Redis, each scenario in a fresh database and key prefix:
//
//	drain    a backlog of -rows to a no-op sink and to a local HTTP receiver
//	steady   -rate events/s for -for, commit→delivered p50/p95/p99, NOTIFY off/on
//	wake     one event after an idle second, commit→delivered, NOTIFY off/on
//	producer insert transactions/s with and without the NOTIFY trigger, 1 and 16 clients
//
// Each scenario runs -runs times; the table shows medians. Round trips per
// batch are counted with a pgx tracer and a go-redis hook.
//
//	go run ./cmd/outboxd-bench -runs 3
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/dispatch/webhook"
	"github.com/outboxd/outboxd/internal/metrics"
	"github.com/outboxd/outboxd/lock/redislease"
	"github.com/outboxd/outboxd/migrations"
	"github.com/outboxd/outboxd/poller"
	"github.com/outboxd/outboxd/store"
)

var (
	pgDSN     = flag.String("dsn", envOr("OUTBOXD_TEST_POSTGRES_DSN", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"), "maintenance DSN (databases are created beside it)")
	redisAddr = flag.String("redis", envOr("OUTBOXD_TEST_REDIS_ADDR", "127.0.0.1:6379"), "Redis address")
	runs      = flag.Int("runs", 3, "runs per scenario (medians reported)")
	rows      = flag.Int("rows", 100000, "backlog size for drain")
	batch     = flag.Int("batch", 1000, "poller batch size")
	conc      = flag.Int("concurrency", 32, "poller concurrency")
	rate      = flag.Int("rate", 1000, "events/s for steady")
	steadyFor = flag.Duration("for", 10*time.Second, "duration of steady and producer runs")
	only      = flag.String("only", "", "run only this scenario: drain, steady, wake or producer")
	pollEvery = flag.Duration("poll", 100*time.Millisecond, "poller.poll_interval")
	perTx     = flag.Int("per-tx", 1, "events per producer transaction in steady (rate counts events)")
)

func envOr(k, d string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return d
}

func main() {
	flag.Parse()
	ctx := context.Background()
	fmt.Printf("outboxd-bench: %d runs, rows %d, batch %d, concurrency %d, GOMAXPROCS %s\n\n",
		*runs, *rows, *batch, *conc, os.Getenv("GOMAXPROCS"))
	for _, sc := range scenarios {
		if *only == "" || *only == sc.name {
			sc.report(ctx)
		}
	}
}

// scenarios run in this order; -only picks one by name.
var scenarios = []struct {
	name   string
	report func(context.Context)
}{
	{"drain", reportDrain},
	{"steady", reportSteady},
	{"wake", reportWake},
	{"producer", reportProducer},
}

// reportDrain prints drain's medians for each sink, and the process's peak RSS.
func reportDrain(ctx context.Context) {
	for _, sink := range []string{"noop", "webhook"} {
		var evs, pgRT, redisRT []float64
		for range *runs {
			r := drain(ctx, sink)
			evs, pgRT, redisRT = append(evs, r.perSec), append(pgRT, r.pgPerBatch), append(redisRT, r.redisPerBatch)
		}
		fmt.Printf("drain %-7s %d rows: %8.0f ev/s (median of %v)  PG round trips/batch %.2f  Redis round trips/batch %.2f\n",
			sink, *rows, median(evs), rounded(evs), median(pgRT), median(redisRT))
	}
	fmt.Printf("peak RSS of this process (relay + receiver + harness): %s\n", peakRSS())
	fmt.Println()
}

// reportSteady prints steady's latency medians with NOTIFY off and on.
func reportSteady(ctx context.Context) {
	for _, notify := range []bool{false, true} {
		var p50, p95, p99, got []float64
		for range *runs {
			q := steady(ctx, notify)
			p50, p95, p99, got = append(p50, q[0]), append(p95, q[1]), append(p99, q[2]), append(got, q[3])
		}
		fmt.Printf("steady %d ev/s x%d per tx (achieved %.0f) notify=%-5t commit→delivered p50 %6.2f ms  p95 %6.2f ms  p99 %6.2f ms (medians of %d)\n",
			*rate, *perTx, median(got), notify, median(p50), median(p95), median(p99), *runs)
	}
	fmt.Println()
}

// reportWake prints the idle wake-up latency with NOTIFY off and on.
func reportWake(ctx context.Context) {
	for _, notify := range []bool{false, true} {
		lat := wake(ctx, notify, 10)
		fmt.Printf("idle wake notify=%-5t single event after 1.2 s idle: p50 %6.1f ms  max %6.1f ms (%d samples, poll_interval %s)\n",
			notify, lat[len(lat)/2], lat[len(lat)-1], len(lat), *pollEvery)
	}
	fmt.Println()
}

// reportProducer prints the producer's transaction rate without and with
// the NOTIFY trigger.
func reportProducer(ctx context.Context) {
	for _, clients := range []int{1, 16} {
		var off, on []float64
		for range *runs {
			off = append(off, producer(ctx, clients, false))
			on = append(on, producer(ctx, clients, true))
		}
		fmt.Printf("producer %2d clients: %8.0f tx/s without trigger, %8.0f tx/s with NOTIFY trigger (%+.0f%%)\n",
			clients, median(off), median(on), 100*(median(on)/median(off)-1))
	}
}

// ---- environment ----

type env struct {
	dsn    string
	st     *store.Store
	rdb    *redis.Client
	prefix string
	pgQ    atomic.Int64 // queries sent (round trips)
	redisQ atomic.Int64 // commands or pipelines sent
	drop   func()
}

type pgCounter struct{ n *atomic.Int64 }

func (c pgCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c pgCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

type redisCounter struct{ n *atomic.Int64 }

func (c redisCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c redisCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { c.n.Add(1); return next(ctx, cmd) }
}
func (c redisCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { c.n.Add(1); return next(ctx, cmds) }
}

func newEnv(ctx context.Context) *env {
	name := fmt.Sprintf("outboxd_bench_%d", time.Now().UnixNano())
	admin, err := pgx.Connect(ctx, *pgDSN)
	check(err)
	_, err = admin.Exec(ctx, "CREATE DATABASE "+name)
	check(err)
	dsn := replaceDB(*pgDSN, name)
	_, err = migrations.Up(ctx, dsn, nil)
	check(err)
	e := &env{dsn: dsn, prefix: "bench:" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"}
	pcfg, err := pgxpool.ParseConfig(dsn)
	check(err)
	pcfg.MaxConns = 32
	pcfg.ConnConfig.Tracer = pgCounter{&e.pgQ}
	e.st, err = store.OpenConfig(ctx, pcfg)
	check(err)
	e.rdb = redis.NewClient(&redis.Options{Addr: *redisAddr, ContextTimeoutEnabled: true, PoolSize: 64})
	e.rdb.AddHook(redisCounter{&e.redisQ})
	e.drop = func() {
		e.st.Close()
		iter := e.rdb.Scan(ctx, 0, e.prefix+"*", 5000).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
			if len(keys) == 5000 {
				e.rdb.Unlink(ctx, keys...)
				keys = keys[:0]
			}
		}
		if len(keys) > 0 {
			e.rdb.Unlink(ctx, keys...)
		}
		_ = e.rdb.Close()
		_, _ = admin.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)")
		_ = admin.Close(ctx)
	}
	return e
}

func replaceDB(dsn, db string) string {
	cfg, err := pgx.ParseConfig(dsn)
	check(err)
	// Keep the DSN's form; only the database changes.
	return fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", cfg.User, cfg.Host, cfg.Port, db)
}

func (e *env) poller(sink dispatch.Sink, notify bool) *poller.Poller {
	m := metrics.New()
	locks := redislease.New([]redis.UniversalClient{e.rdb}, redislease.WithKeyPrefix(e.prefix))
	return poller.New(poller.Config{
		BatchSize: *batch, PollInterval: *pollEvery, KeyPrefix: e.prefix, Notify: notify,
	}, poller.Deps{Store: e.st, Locks: locks, Redis: e.rdb, Sink: sink, Log: slog.New(slog.NewJSONHandler(io.Discard, nil)), Metrics: m})
}

func run(p *poller.Poller) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = p.Run(ctx) })
	return func() { cancel(); wg.Wait() }
}

// ---- drain ----

type drainResult struct{ perSec, pgPerBatch, redisPerBatch float64 }

func drain(ctx context.Context, sinkName string) drainResult {
	e := newEnv(ctx)
	defer e.drop()
	_, err := e.st.Pool().Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'deal', (i % 1000)::text, 'deal.funded', jsonb_build_object('seq', i, 'amount_cents', i * 10)
		FROM generate_series(1, @rows) i`, pgx.NamedArgs{"rows": *rows})
	check(err)
	_, err = e.st.Pool().Exec(ctx, `VACUUM ANALYZE outbox`)
	check(err)

	var sink dispatch.Sink = dispatch.Noop{}
	if sinkName == "webhook" {
		url, closeSrv := receiver(nil)
		defer closeSrv()
		w, err := webhook.New(webhook.Config{URL: url, Concurrency: *conc})
		check(err)
		sink = w
	}
	p := e.poller(sink, false)
	e.pgQ.Store(0)
	e.redisQ.Store(0)
	start := time.Now()
	stop := run(p)
	// Progress on its own untraced connection, with a query the pending index answers.
	progress, err := pgx.Connect(ctx, e.dsn)
	check(err)
	defer progress.Close(ctx)
	for {
		var left bool
		check(progress.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM outbox WHERE dispatched_at IS NULL AND dead_at IS NULL)`).Scan(&left))
		if !left {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	elapsed := time.Since(start)
	stop()
	batches := float64((*rows + *batch - 1) / *batch)
	// Leadership set-up and the empty polls after the backlog are not per batch:
	// count what a batch of rows costs.
	pg, rd := float64(e.pgQ.Load()), float64(e.redisQ.Load())
	return drainResult{float64(*rows) / elapsed.Seconds(), pg / batches, rd / batches}
}

// receiver serves 204s on a loopback port; onEvent, if set, sees each id.
func receiver(onEvent func(id int64)) (string, func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if onEvent != nil {
			var ev struct {
				ID int64 `json:"id"`
			}
			_ = json.Unmarshal(body, &ev)
			onEvent(ev.ID)
		}
		w.WriteHeader(http.StatusNoContent)
	})}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String() + "/events", func() { _ = srv.Close() }
}

// ---- steady ----

func steady(ctx context.Context, notify bool) [4]float64 {
	e := newEnv(ctx)
	defer e.drop()
	check(e.st.SetNotifyTrigger(ctx, notify))
	var mu sync.Mutex
	committed := map[int64]time.Time{}
	delivered := map[int64]time.Time{}
	url, closeSrv := receiver(func(id int64) {
		now := time.Now()
		mu.Lock()
		if _, ok := delivered[id]; !ok {
			delivered[id] = now
		}
		mu.Unlock()
	})
	defer closeSrv()
	w, err := webhook.New(webhook.Config{URL: url, Concurrency: *conc})
	check(err)
	stop := run(e.poller(w, notify))
	defer stop()
	time.Sleep(300 * time.Millisecond) // leadership acquired

	// Open-loop producer: one event per transaction at the given rate. The
	// first second warms up (the runner wakes from its idle back-off, at most
	// poller.poll_interval) and is not measured.
	k := max(*perTx, 1)
	interval := time.Second * time.Duration(k) / time.Duration(*rate)
	warm := *rate / k
	n := warm + int(steadyFor.Seconds()*float64(*rate))/k // transactions
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	start := time.Now()
	for i := range n {
		time.Sleep(time.Until(start.Add(time.Duration(i) * interval)))
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			var ids []int64
			err := pgx.BeginFunc(ctx, e.st.Pool(), func(tx pgx.Tx) error {
				rows, err := tx.Query(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
					SELECT 'deal', ((@tx::int * 7 + g) % 100)::text, 'deal.funded', '{}'
					FROM generate_series(1, @events::int) g RETURNING id`, pgx.NamedArgs{"tx": i, "events": k})
				if err != nil {
					return err
				}
				ids, err = pgx.CollectRows(rows, pgx.RowTo[int64])
				return err
			})
			check(err)
			now := time.Now()
			mu.Lock()
			if i >= warm {
				for _, id := range ids {
					committed[id] = now
				}
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	achieved := float64(n*k) / time.Since(start).Seconds() // the producers' real rate, in events
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		done := len(delivered) >= n*k
		mu.Unlock()
		if done || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	var lat []float64
	for id, c := range committed {
		if d, ok := delivered[id]; ok {
			// Delivery can land before the producer's commit returns to it.
			lat = append(lat, max(0, float64(d.Sub(c).Microseconds())/1000))
		}
	}
	if len(lat) < (n-warm)*k {
		fmt.Fprintf(os.Stderr, "steady: only %d of %d delivered\n", len(lat), (n-warm)*k)
	}
	sort.Float64s(lat)
	q := func(p float64) float64 { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	return [4]float64{q(0.50), q(0.95), q(0.99), achieved}
}

// ---- idle wake-up ----

func wake(ctx context.Context, notify bool, samples int) []float64 {
	e := newEnv(ctx)
	defer e.drop()
	check(e.st.SetNotifyTrigger(ctx, notify))
	got := make(chan time.Time, 1)
	url, closeSrv := receiver(func(int64) { got <- time.Now() })
	defer closeSrv()
	w, err := webhook.New(webhook.Config{URL: url, Concurrency: *conc})
	check(err)
	stop := run(e.poller(w, notify))
	defer stop()
	var lat []float64
	for range samples {
		time.Sleep(1200 * time.Millisecond) // idle: the runner backs off to poll_interval
		_, err := e.st.Pool().Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
			VALUES ('deal', '1', 'deal.funded', '{}')`)
		check(err)
		committed := time.Now()
		lat = append(lat, float64((<-got).Sub(committed).Microseconds())/1000)
	}
	sort.Float64s(lat)
	return lat
}

// ---- producer cost of NOTIFY ----

func producer(ctx context.Context, clients int, trigger bool) float64 {
	e := newEnv(ctx)
	defer e.drop()
	check(e.st.SetNotifyTrigger(ctx, trigger))
	var n atomic.Int64
	dctx, cancel := context.WithTimeout(ctx, *steadyFor/2)
	defer cancel()
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for dctx.Err() == nil {
				err := pgx.BeginFunc(dctx, e.st.Pool(), func(tx pgx.Tx) error {
					_, err := tx.Exec(dctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
						VALUES ('deal', @aggregate, 'deal.funded', '{}')`, pgx.NamedArgs{"aggregate": strconv.Itoa(c)})
					return err
				})
				if err == nil {
					n.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return float64(n.Load()) / (*steadyFor / 2).Seconds()
}

// ---- helpers ----

// peakRSS reads VmHWM from /proc (Linux).
func peakRSS() string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "unknown"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			return strings.TrimSpace(strings.TrimPrefix(line, "VmHWM:"))
		}
	}
	return "unknown"
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	sort.Float64s(s)
	return s[len(s)/2]
}

func rounded(xs []float64) []int {
	out := make([]int, len(xs))
	for i, x := range xs {
		out[i] = int(x)
	}
	return out
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "outboxd-bench:", err)
		os.Exit(1)
	}
}
