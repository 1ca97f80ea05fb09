package poller

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/outboxd/outboxd/dispatch/webhook"
	"github.com/outboxd/outboxd/internal/metrics"
	"github.com/outboxd/outboxd/internal/term"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/internal/testkit"
	"github.com/outboxd/outboxd/lock/redislease"
	"github.com/outboxd/outboxd/migrations"
	"github.com/outboxd/outboxd/store"
)

func TestMain(m *testing.M) {
	if childMain() {
		return
	}
	testenv.Main(m)
}

// testBundle is a test's bundle: its own database, Redis key prefix and
// recording webhook receiver.
type testBundle struct {
	t      *testing.T
	st     *store.Store
	dsn    string
	rdb    *redis.Client
	prefix string
	rc     *testkit.Receiver
}

func setup(t *testing.T) *testBundle {
	t.Parallel() // own database, own key prefix, own receiver
	st, dsn := testenv.Store(t)
	rdb, prefix := testenv.Redis(t)
	return &testBundle{t: t, st: st, dsn: dsn, rdb: rdb, prefix: prefix, rc: testkit.NewReceiver(t)}
}

// insert writes n events round-robin over aggregates "deal/0".. and returns
// their ids in order.
func (e *testBundle) insert(n, aggregates int) []int64 {
	e.t.Helper()
	ctx := context.Background()
	var evs []store.Event
	for i := range n {
		evs = append(evs, store.Event{AggregateType: "deal", AggregateID: strconv.Itoa(i % aggregates),
			EventType: "deal.funded", Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))})
	}
	for len(evs) > 0 {
		chunk := evs[:min(len(evs), 1000)]
		evs = evs[len(chunk):]
		if err := pgx.BeginFunc(ctx, e.st.Pool(), func(tx pgx.Tx) error { return store.Enqueue(ctx, tx, chunk...) }); err != nil {
			e.t.Fatal(err)
		}
	}
	rows, _ := e.st.Pool().Query(ctx, `SELECT id FROM outbox ORDER BY id`)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		e.t.Fatal(err)
	}
	return ids
}

// testCfg is a runner's Config plus its webhook sink's concurrency.
type testCfg struct {
	Config
	Concurrency int // aggregates sent at once
}

func testConfig() testCfg {
	return testCfg{Config: Config{
		LockTTL: 2 * time.Second, LockWait: 500 * time.Millisecond, BatchSize: 100, PollInterval: 20 * time.Millisecond,
		MaxAttempts: 25, ClaimTTL: time.Second, BackoffBase: 10 * time.Millisecond,
		BackoffMax: 100 * time.Millisecond, ShutdownTimeout: 5 * time.Second,
	}, Concurrency: 8}
}

type runner struct {
	*Poller
	m *metrics.Metrics
}

// poller builds a runner on e's services; lockPrefix "" means e.prefix.
func (e *testBundle) poller(cfg testCfg, lockPrefix string) *runner {
	if lockPrefix == "" {
		lockPrefix = e.prefix
	}
	cfg.KeyPrefix = e.prefix
	sink, err := webhook.New(webhook.Config{URL: e.rc.URL(), Timeout: 5 * time.Second, Concurrency: cfg.Concurrency})
	if err != nil {
		e.t.Fatal(err)
	}
	m := metrics.New()
	locks := redislease.New([]redis.UniversalClient{e.rdb}, redislease.WithKeyPrefix(lockPrefix), redislease.WithHooks(term.Hooks(m)))
	log := testkit.Logger(e.t)
	return &runner{New(cfg.Config, Deps{Store: e.st, Locks: locks, Redis: e.rdb, Sink: sink, Log: log, Metrics: m}), m}
}

// run starts r; the returned stop cancels it and waits for Run to return.
func (e *testBundle) run(r *runner) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				e.t.Errorf("Run returned %v", err)
			}
		})
	}
	e.t.Cleanup(stop)
	return stop
}

// waitFor waits until cond holds, failing the test after timeout.
func (e *testBundle) waitFor(what string, timeout time.Duration, cond func() bool) {
	e.t.Helper()
	testkit.WaitFor(e.t, timeout, what, cond, nil)
}

func (e *testBundle) count(where string) int {
	e.t.Helper()
	var n int
	if err := e.st.Pool().QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE `+where).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

func (e *testBundle) waitAllDispatched(timeout time.Duration) {
	e.t.Helper()
	e.waitFor("every row dispatched", timeout, func() bool { return e.count("dispatched_at IS NULL") == 0 })
}

// checkDelivered asserts every id got at least one 2xx.
func (e *testBundle) checkDelivered(ids []int64) (duplicates int) {
	e.t.Helper()
	ok := e.rc.OKCounts()
	for _, id := range ids {
		if ok[id] == 0 {
			e.t.Fatalf("event %d never delivered (lost)", id)
		}
		duplicates += ok[id] - 1
	}
	return duplicates
}

// checkOrder asserts first successful deliveries are in id order per aggregate.
func (e *testBundle) checkOrder() {
	e.t.Helper()
	if v := testkit.OrderViolations(e.rc.Requests()); len(v) > 0 {
		e.t.Fatalf("order broken: %s", strings.Join(v, "; "))
	}
}

// ---- a runner in its own process, to kill or pause for real ----

const childEnv = "OUTBOXD_TEST_POLLER_CHILD"

type child struct {
	cmd      *exec.Cmd
	mu       sync.Mutex
	out      strings.Builder
	wg       sync.WaitGroup
	waitOnce sync.Once
	waitErr  error
}

// startChild runs a runner as a process: crash names the window where it
// SIGKILLs itself ("" runs normally until SIGTERM).
func (e *testBundle) startChild(crash string, cfg testCfg) *child {
	e.t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", "C_DSN="+e.dsn, "C_REDIS="+testenv.RedisAddr(),
		"C_PREFIX="+e.prefix, "C_URL="+e.rc.URL(), "C_CRASH="+crash,
		"C_TTL="+cfg.LockTTL.String(), "C_BATCH="+strconv.Itoa(cfg.BatchSize),
		"C_CONC="+strconv.Itoa(cfg.Concurrency), "C_CLAIM="+cfg.ClaimTTL.String())
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	c := &child{cmd: cmd}
	c.wg.Go(func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.mu.Lock()
			c.out.WriteString(sc.Text() + "\n")
			c.mu.Unlock()
		}
	})
	e.t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = c.wait() // killed just now: its exit error is expected
	})
	return c
}

// wait returns how the process ended (after its output has been read).
func (c *child) wait() error {
	c.waitOnce.Do(func() {
		c.wg.Wait()
		c.waitErr = c.cmd.Wait()
	})
	return c.waitErr
}

func (c *child) logs() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.String()
}

func (c *child) signal(t *testing.T, s syscall.Signal) {
	if err := c.cmd.Process.Signal(s); err != nil {
		t.Fatalf("signal %v: %v", s, err)
	}
}

func childMain() bool {
	if os.Getenv(childEnv) == "" {
		return false
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	fail := func(err error) { fmt.Fprintln(os.Stderr, "child:", err); os.Exit(3) }
	st, err := store.Open(ctx, os.Getenv("C_DSN"))
	if err != nil {
		fail(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("C_REDIS"), ContextTimeoutEnabled: true})
	prefix := os.Getenv("C_PREFIX")
	cfg := testConfig()
	cfg.Concurrency, _ = strconv.Atoi(os.Getenv("C_CONC"))
	sink, err := webhook.New(webhook.Config{URL: os.Getenv("C_URL"), Timeout: 30 * time.Second, Concurrency: cfg.Concurrency})
	if err != nil {
		fail(err)
	}
	cfg.KeyPrefix = prefix
	cfg.LockTTL, _ = time.ParseDuration(os.Getenv("C_TTL"))
	cfg.ClaimTTL, _ = time.ParseDuration(os.Getenv("C_CLAIM"))
	cfg.BatchSize, _ = strconv.Atoi(os.Getenv("C_BATCH"))
	m := metrics.New()
	locks := redislease.New([]redis.UniversalClient{rdb}, redislease.WithKeyPrefix(prefix), redislease.WithHooks(term.Hooks(m)))
	p := New(cfg.Config, Deps{Store: st, Locks: locks, Redis: rdb, Sink: sink, Log: slog.New(slog.NewJSONHandler(os.Stdout, nil)), Metrics: m})
	kill := func() { _ = syscall.Kill(os.Getpid(), syscall.SIGKILL); select {} }
	switch os.Getenv("C_CRASH") {
	case "after-claim":
		p.hooks.afterClaim = kill
	case "after-send":
		p.hooks.afterSend = kill
	case "after-finalize":
		p.hooks.afterFinalize = kill
	}
	_ = p.Run(ctx)
	os.Exit(0)
	return true
}

// privatePostgres moves e onto a Postgres server of its own, migrated: for
// tests that crash it or change its settings, or that need no other test's
// transactions in its snapshots.
func (e *testBundle) privatePostgres() (*testenv.PostgresServer, *store.Store) {
	e.t.Helper()
	pg := testenv.StartPostgresServer(e.t)
	ctx := context.Background()
	if _, err := migrations.Up(ctx, pg.DSN, nil); err != nil {
		e.t.Fatal(err)
	}
	st, err := store.Open(ctx, pg.DSN)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(st.Close)
	e.st = st
	return pg, st
}

// loggedRunner is a runner whose log lines (debug included) the test reads.
func (e *testBundle) loggedRunner(cfg testCfg) (*runner, *testkit.Logs) {
	cfg.KeyPrefix = e.prefix
	sink, err := webhook.New(webhook.Config{URL: e.rc.URL(), Timeout: 5 * time.Second, Concurrency: cfg.Concurrency})
	if err != nil {
		e.t.Fatal(err)
	}
	logs := &testkit.Logs{}
	m := metrics.New()
	locks := redislease.New([]redis.UniversalClient{e.rdb}, redislease.WithKeyPrefix(e.prefix), redislease.WithHooks(term.Hooks(m)))
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	return &runner{New(cfg.Config, Deps{Store: e.st, Locks: locks, Redis: e.rdb, Sink: sink, Log: log, Metrics: m}), m}, logs
}

// racer is a producer transaction left open after taking its id.
type racer struct {
	tx pgx.Tx
	id int64
}

func (e *testBundle) race(agg string) *racer {
	e.t.Helper()
	ctx := context.Background()
	tx, err := e.st.Pool().Begin(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if err := store.Enqueue(ctx, tx, event(agg)); err != nil {
		e.t.Fatal(err)
	}
	var id int64
	if err := tx.QueryRow(ctx, `SELECT currval(pg_get_serial_sequence('outbox', 'id'))`).Scan(&id); err != nil {
		e.t.Fatal(err)
	}
	return &racer{tx: tx, id: id}
}

func (r *racer) commit(t *testing.T) {
	t.Helper()
	if err := r.tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func event(agg string) store.Event {
	return store.Event{AggregateType: "deal", AggregateID: agg, EventType: "deal.funded", Payload: json.RawMessage(`{}`)}
}

// produce commits one event of agg and returns its id.
func (e *testBundle) produce(agg string) int64 {
	e.t.Helper()
	r := e.race(agg)
	r.commit(e.t)
	return r.id
}

// delivered reports whether id got a 2xx.
func (e *testBundle) delivered(id int64) bool { return e.rc.OKCounts()[id] > 0 }

// firstArrival is the Seq of id's first 2xx, -1 if none.
func (e *testBundle) firstArrival(id int64) int {
	for _, r := range e.rc.Requests() {
		if r.ID == id && r.OK() {
			return r.Seq
		}
	}
	return -1
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
