// Package fault breaks a running outboxd cluster on purpose and checks its
// guarantees. It builds the real binary and runs three replicas as processes
// against real Postgres and a redis-server of its own, with short TTLs, a
// recording webhook receiver and a producer writing steadily across many
// aggregates.
package fault

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/migrations"
	"github.com/outboxd/outboxd/store"
)

// binary is built with the race detector; plainBinary as users run it, for
// cases that time what a user experiences.
var binary, plainBinary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "outboxd-fault")
	if err != nil {
		panic(err)
	}
	binary, plainBinary = filepath.Join(dir, "outboxd-race"), filepath.Join(dir, "outboxd")
	for _, args := range [][]string{{"build", "-race", "-o", binary}, {"build", "-o", plainBinary}} {
		out, err := exec.Command("go", append(args, "../../cmd/outboxd")...).CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "fault: build outboxd: %v\n%s", err, out)
			os.Exit(1)
		}
	}
	defer os.RemoveAll(dir)
	testenv.Main(m)
}

const (
	lockTTL   = time.Second
	batchSize = 50
)

// hit is one request at the receiver, in arrival order.
type hit struct {
	id     int64
	agg    string
	token  int64
	status int
	at     time.Time
}

type receiver struct {
	mu      sync.Mutex
	hits    []hit
	status  func(agg string) int // nil: 204
	holdAgg string               // requests for this aggregate wait for release
	heldN   int
	release chan struct{}
}

// hold makes requests for agg wait until the returned release is called.
func (rc *receiver) hold(agg string) (release func()) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.holdAgg, rc.heldN, rc.release = agg, 0, make(chan struct{})
	ch := rc.release
	var once sync.Once
	return func() {
		once.Do(func() {
			rc.mu.Lock()
			rc.holdAgg = ""
			rc.mu.Unlock()
			close(ch)
		})
	}
}

func (rc *receiver) held() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.heldN
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var ev dispatch.Event
	_ = json.Unmarshal(body, &ev)
	token, _ := strconv.ParseInt(r.Header.Get("X-Fencing-Token"), 10, 64)
	agg := ev.AggregateType + "/" + ev.AggregateID
	rc.mu.Lock()
	if agg == rc.holdAgg {
		rc.heldN++
		ch := rc.release
		rc.mu.Unlock()
		<-ch
		rc.mu.Lock()
	}
	code := http.StatusNoContent
	if rc.status != nil {
		code = rc.status(agg)
	}
	rc.hits = append(rc.hits, hit{ev.ID, agg, token, code, time.Now()})
	rc.mu.Unlock()
	w.WriteHeader(code)
}

func (rc *receiver) setStatus(f func(agg string) int) {
	rc.mu.Lock()
	rc.status = f
	rc.mu.Unlock()
}

func (rc *receiver) snapshot() []hit {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]hit(nil), rc.hits...)
}

type replica struct {
	i       int
	addr    string
	cmd     *exec.Cmd
	mu      sync.Mutex
	out     strings.Builder
	done    chan struct{}
	waitErr error
	killed  bool // by the test: any exit is expected
}

func (r *replica) logs() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.out.String()
}

func (r *replica) exited() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

type cluster struct {
	t       *testing.T
	pg      *testenv.PostgresServer // own instance, if asked for
	toxi    *toxiproxy.ApiServer
	pgProxy *toxiproxy.Proxy
	redisPx map[int]*toxiproxy.Proxy // per replica slot
	st      *store.Store
	dsn     string
	redis   *testenv.RedisServer
	redisA  string // address the replicas use for Redis (may be a proxy)
	pgDSN   string // DSN the replicas use for Postgres (may be a proxy)
	rc      *receiver
	srv     *httptest.Server
	reps    []*replica
	ended   []*replica // replicas replaced by restarts

	binary string   // the outboxd binary the replicas run
	batch  int      // poller.batch_size of the replicas
	env    []string // per-case overrides of the replicas' settings

	prodMu    sync.Mutex
	committed []int64
	prodStop  context.CancelFunc
	prodDone  chan struct{}
}

type options struct {
	ownPostgres bool     // a private Postgres instance, for restarts
	proxies     bool     // toxiproxy between each replica and Redis, and before Postgres
	batch       int      // poller.batch_size; 0 means batchSize
	plain       bool     // run the binary without the race detector (timing what users get)
	env         []string // OUTBOXD_* settings overriding the suite's defaults
}

func newCluster(t *testing.T, opt options) *cluster {
	var st *store.Store
	var dsn string
	var pg *testenv.PostgresServer
	if opt.ownPostgres {
		pg = testenv.StartPostgresServer(t)
		dsn = pg.DSN
		if _, err := migrations.Up(context.Background(), dsn, nil); err != nil {
			t.Fatal(err)
		}
		var err error
		if st, err = store.Open(context.Background(), dsn); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.Close)
	} else {
		st, dsn = testenv.Store(t)
	}
	rs := testenv.StartRedisServer(t)
	rc := &receiver{}
	srv := httptest.NewServer(rc)
	t.Cleanup(func() {
		rc.mu.Lock()
		if rc.release != nil && rc.holdAgg != "" {
			close(rc.release) // never leave a handler blocked: Close waits for it
		}
		rc.mu.Unlock()
		srv.Close()
	})
	c := &cluster{t: t, st: st, dsn: dsn, pgDSN: dsn, redis: rs, redisA: rs.Addr, rc: rc, srv: srv, pg: pg,
		batch: cmp.Or(opt.batch, batchSize), env: opt.env, binary: binary}
	if opt.plain {
		c.binary = plainBinary
	}
	if opt.proxies {
		c.toxi = toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		c.pgProxy = c.proxy("postgres", u.Host)
		u.Host = c.pgProxy.Listen
		c.pgDSN = u.String()
	}
	// Every value outbox_fence ever takes, in order.
	for _, sql := range []string{
		`CREATE TABLE fence_audit (seq bigserial, lock_name text, token bigint)`,
		`CREATE FUNCTION fence_audit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
		   INSERT INTO fence_audit (lock_name, token) VALUES (NEW.lock_name, NEW.token); RETURN NEW; END $$`,
		`CREATE TRIGGER fence_audit AFTER INSERT OR UPDATE ON outbox_fence FOR EACH ROW EXECUTE FUNCTION fence_audit()`,
	} {
		if _, err := st.Pool().Exec(context.Background(), sql); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, r := range append(c.reps, c.ended...) {
			if !r.exited() {
				_ = r.cmd.Process.Signal(syscall.SIGCONT)
				_ = r.cmd.Process.Kill()
				<-r.done
			}
		}
	})
	return c
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func (c *cluster) proxy(name, upstream string) *toxiproxy.Proxy {
	c.t.Helper()
	p := toxiproxy.NewProxy(c.toxi, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(p.Stop)
	return p
}

// toxic adds a toxic (toxiproxy JSON) to p; the returned func removes it.
func (c *cluster) toxic(p *toxiproxy.Proxy, name, kind, stream string, attrs string) (remove func()) {
	c.t.Helper()
	js := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"toxicity":1,"attributes":%s}`, name, kind, stream, attrs)
	if _, err := p.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
		c.t.Fatal(err)
	}
	return func() { _ = p.Toxics.RemoveToxic(context.Background(), name) }
}

// redisAddrFor gives replica slot i its own proxy to Redis when proxies are on.
func (c *cluster) redisAddrFor(i int) string {
	if c.toxi == nil {
		return c.redisA
	}
	if c.redisPx == nil {
		c.redisPx = map[int]*toxiproxy.Proxy{}
	}
	if c.redisPx[i] == nil {
		c.redisPx[i] = c.proxy("redis-"+strconv.Itoa(i), c.redis.Addr)
	}
	return c.redisPx[i].Listen
}

// start launches replica i (replacing an ended one).
func (c *cluster) start(i int) {
	c.t.Helper()
	r := &replica{i: i, addr: freeAddr(c.t), done: make(chan struct{})}
	cmd := exec.Command(c.binary, "run")
	cmd.Env = append(os.Environ(),
		"OUTBOXD_POSTGRES_DSN="+c.pgDSN,
		"OUTBOXD_REDIS_ADDRS="+c.redisAddrFor(i),
		"OUTBOXD_DISPATCH_WEBHOOK_URL="+c.srv.URL+"/events",
		"OUTBOXD_DISPATCH_WEBHOOK_TIMEOUT=400ms", // at most lock_ttl/2
		"OUTBOXD_HTTP_ADDR="+r.addr,
		"OUTBOXD_POLLER_LOCK_TTL="+lockTTL.String(),
		"OUTBOXD_POLLER_LOCK_WAIT=300ms",
		"OUTBOXD_POLLER_POLL_INTERVAL=20ms",
		"OUTBOXD_POLLER_BATCH_SIZE="+strconv.Itoa(c.batch),
		"OUTBOXD_POLLER_CONCURRENCY=8",
		"OUTBOXD_POLLER_CLAIM_TTL=2s",
		"OUTBOXD_POLLER_BACKOFF_BASE=50ms",
		"OUTBOXD_POLLER_BACKOFF_MAX=2s",
		"OUTBOXD_POLLER_MAX_ATTEMPTS=50",
		"OUTBOXD_RECONCILE_SCHEDULE=@every 2s",
		"OUTBOXD_RECONCILE_LOCK_TTL=3s",
		"OUTBOXD_SHUTDOWN_TIMEOUT=5s",
	)
	cmd.Env = append(cmd.Env, c.env...) // the last value of a key wins
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		c.t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	r.cmd = cmd
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			r.mu.Lock()
			r.out.WriteString(sc.Text() + "\n")
			r.mu.Unlock()
		}
		r.waitErr = cmd.Wait()
		close(r.done)
	}()
	if i < len(c.reps) {
		c.ended = append(c.ended, c.reps[i])
		c.reps[i] = r
	} else {
		c.reps = append(c.reps, r)
	}
}

func (c *cluster) startAll(n int) {
	for i := range n {
		c.start(i)
	}
}

// waitHeld waits until the leader has a request held at the receiver (so a
// batch is in flight), then a little longer for the batch's other aggregates.
func (c *cluster) waitHeld() {
	c.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for c.rc.held() == 0 {
		if time.Now().After(deadline) {
			c.t.Fatal("no request for the held aggregate arrived")
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
}

// statusClient times out: a paused replica never answers.
var statusClient = &http.Client{Timeout: 500 * time.Millisecond}

// leader returns the index of the replica whose /status says it leads.
func (c *cluster) leader() int {
	c.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		for i, r := range c.reps {
			if r.exited() {
				continue
			}
			resp, err := statusClient.Get("http://" + r.addr + "/status")
			if err != nil {
				continue
			}
			var s struct {
				Locks []struct {
					Name string `json:"name"`
					Held bool   `json:"held_by_this_replica"`
				} `json:"locks"`
			}
			_ = json.NewDecoder(resp.Body).Decode(&s)
			resp.Body.Close()
			if len(s.Locks) > 0 && s.Locks[0].Held {
				return i
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.t.Fatal("no replica leads")
	return -1
}

func (c *cluster) signal(i int, s syscall.Signal) {
	c.t.Helper()
	if s == syscall.SIGKILL {
		c.reps[i].killed = true
	}
	if err := c.reps[i].cmd.Process.Signal(s); err != nil {
		c.t.Fatalf("signal %v to replica %d: %v", s, i, err)
	}
}

// produce writes 1-3 events per transaction across 40 aggregates until stopped.
func (c *cluster) produce() {
	ctx, cancel := context.WithCancel(context.Background())
	c.prodStop, c.prodDone = cancel, make(chan struct{})
	go func() {
		defer close(c.prodDone)
		pool := c.st.Pool()
		for n := 0; ctx.Err() == nil; n++ {
			var ids []int64
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				rows, err := tx.Query(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
					SELECT 'deal', ((($1::int * 7) + g) % 40)::text, 'deal.funded', jsonb_build_object('n', $1::int)
					FROM generate_series(1, 1 + $1::int % 3) g RETURNING id`, n)
				if err != nil {
					return err
				}
				ids, err = pgx.CollectRows(rows, pgx.RowTo[int64])
				return err
			})
			if err == nil {
				c.prodMu.Lock()
				c.committed = append(c.committed, ids...)
				c.prodMu.Unlock()
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
}

func (c *cluster) stopProducing() {
	c.prodStop()
	<-c.prodDone
}

// drain waits until no row is pending (dead rows aside).
func (c *cluster) drain(timeout time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var pending int
		if err := c.st.Pool().QueryRow(context.Background(),
			`SELECT count(*) FROM outbox WHERE dispatched_at IS NULL AND dead_at IS NULL`).Scan(&pending); err != nil {
			c.t.Fatal(err)
		}
		if pending == 0 {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("%d rows still pending after %s", pending, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stopAll sends SIGTERM to every live replica and requires a clean exit.
func (c *cluster) stopAll() {
	c.t.Helper()
	for _, r := range c.reps {
		if !r.exited() {
			_ = r.cmd.Process.Signal(syscall.SIGCONT)
			_ = r.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	for _, r := range c.reps {
		select {
		case <-r.done:
		case <-time.After(20 * time.Second):
			c.t.Fatalf("replica %d did not stop within 20s of SIGTERM", r.i)
		}
	}
}

// report is what a case observed.
type report struct {
	events, delivered, duplicates, dead, tokens, fenceRejected int
}

// check asserts the invariants; faultAt is when the fault was injected.
func (c *cluster) check(faultAt time.Time, deadAggs map[string]bool) report {
	c.t.Helper()
	ctx := context.Background()
	hits := c.rc.snapshot()
	var rep report

	// Dead rows: only where the case made them.
	dead := map[int64]bool{}
	rows, _ := c.st.Pool().Query(ctx, `SELECT id, aggregate_type || '/' || aggregate_id FROM outbox WHERE dead_at IS NOT NULL`)
	for rows.Next() {
		var id int64
		var agg string
		_ = rows.Scan(&id, &agg)
		if !deadAggs[agg] {
			c.t.Errorf("event %d of %s dead-lettered, unexpected in this case", id, agg)
		}
		dead[id] = true
	}
	rep.dead = len(dead)

	// 0 lost: every committed event delivered at least once (or dead by design).
	ok := map[int64]int{}
	for _, h := range hits {
		if h.status >= 200 && h.status < 300 {
			ok[h.id]++
		}
	}
	c.prodMu.Lock()
	committed := append([]int64(nil), c.committed...)
	c.prodMu.Unlock()
	rep.events = len(committed)
	for _, id := range committed {
		switch {
		case ok[id] > 0:
			rep.delivered++
			rep.duplicates += ok[id] - 1
		case dead[id]:
		default:
			c.t.Errorf("event %d lost: committed, never delivered, not dead", id)
		}
	}

	// First deliveries in id order per aggregate.
	seen, last := map[int64]bool{}, map[string]int64{}
	for _, h := range hits {
		if h.status < 200 || h.status >= 300 || seen[h.id] {
			continue
		}
		seen[h.id] = true
		if h.id < last[h.agg] {
			c.t.Errorf("aggregate %s: event %d first delivered after %d", h.agg, h.id, last[h.agg])
		}
		last[h.agg] = h.id
	}

	// After the fault, no delivery carries a token lower than one already seen.
	tokens := map[int64]bool{}
	var newest int64
	for _, h := range hits {
		tokens[h.token] = true
		if h.at.Before(faultAt) {
			continue
		}
		if h.token < newest {
			c.t.Errorf("event %d arrived with token %d after token %d", h.id, h.token, newest)
		}
		newest = max(newest, h.token)
	}
	rep.tokens = len(tokens)

	// Duplicates: at most about one batch per change of leader.
	if limit := c.batch * max(1, rep.tokens-1) * 2; rep.duplicates > limit {
		c.t.Errorf("%d duplicates for %d leaders (limit %d)", rep.duplicates, rep.tokens, limit)
	}

	// outbox_fence only rises.
	frows, _ := c.st.Pool().Query(ctx, `SELECT lock_name, token FROM fence_audit ORDER BY seq`)
	prev := map[string]int64{}
	for frows.Next() {
		var name string
		var tok int64
		_ = frows.Scan(&name, &tok)
		if tok < prev[name] {
			c.t.Errorf("outbox_fence %s went back from %d to %d", name, prev[name], tok)
		}
		prev[name] = tok
	}

	// No replica exited except those the case killed; SIGTERM exits 0.
	for _, r := range append(c.reps, c.ended...) {
		if r.killed {
			continue
		}
		if r.waitErr != nil {
			c.t.Errorf("replica %d exited with %v; logs:\n%s", r.i, r.waitErr, tail(r.logs(), 20))
		}
		rep.fenceRejected += strings.Count(r.logs(), `"msg":"fence rejected"`)
	}
	c.t.Logf("events %d delivered %d duplicates %d dead %d leaders(tokens) %d fence rejections %d",
		rep.events, rep.delivered, rep.duplicates, rep.dead, rep.tokens, rep.fenceRejected)
	return rep
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
