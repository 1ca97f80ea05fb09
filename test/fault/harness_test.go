// Package fault breaks a running outboxd cluster on purpose and checks its
// guarantees. It builds the real binary and runs three replicas as processes
// against real Postgres and a redis-server of its own, with short TTLs, a
// recording webhook receiver and a producer writing steadily across many
// aggregates.
package fault

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
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

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/internal/testkit"
	"github.com/outboxd/outboxd/internal/testproc"
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
	binary, err = testproc.Build(dir, "outboxd-race", true)
	if err == nil {
		plainBinary, err = testproc.Build(dir, "outboxd", false)
	}
	if err != nil {
		_ = os.RemoveAll(dir)
		fmt.Fprintf(os.Stderr, "fault: %v\n", err)
		os.Exit(1)
	}
	code := testenv.Run(m)
	_ = os.RemoveAll(dir) // not deferred: os.Exit skips defers
	os.Exit(code)
}

const (
	lockTTL   = time.Second
	batchSize = 50
)

// replica is one `outboxd run` process of a cluster.
type replica struct {
	*testproc.Process
	i      int
	addr   string
	out    testkit.Logs // stdout and stderr
	killed bool         // by the test: any exit is expected
}

func (r *replica) logs() string { return r.out.String() }

type cluster struct {
	t       *testing.T
	pg      *testenv.PostgresServer // own instance, if asked for
	toxi    *toxiproxy.ApiServer
	pgProxy *toxiproxy.Proxy
	redisPx map[int]*toxiproxy.Proxy // per replica slot
	st      *store.Store
	dsn     string
	redis   *testenv.RedisServer
	redisA  string        // address the replicas use for Redis (may be a proxy)
	etcd    []*etcdMember // the etcd members of lock.backend etcd, if started
	pgDSN   string        // DSN the replicas use for Postgres (may be a proxy)
	rc      *testkit.Receiver
	reps    []*replica
	ended   []*replica // replicas replaced by restarts

	binary string   // the outboxd binary the replicas run
	batch  int      // poller.batch_size of the replicas
	env    []string // per-case overrides of the replicas' settings
	named  bool     // options.named

	prodMu    sync.Mutex
	committed []int64
	longestTx time.Duration // the longest transaction of produceRacing's, begin to commit
	prodStop  context.CancelFunc
	prodDone  chan struct{}
}

type options struct {
	ownPostgres bool     // a private Postgres instance, for restarts
	proxies     bool     // toxiproxy between each replica and Redis, and before Postgres
	batch       int      // poller.batch_size; 0 means batchSize
	plain       bool     // run the binary without the race detector (timing what users get)
	env         []string // OUTBOXD_* settings overriding the suite's defaults
	named       bool     // instance_id replica-<i> for replica i (default: the host name, shared)
	backend     backend  // the lease's backend (backends_test.go); the zero value is the default, Redis
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
	rc := testkit.NewReceiver(t) // releases held requests before closing
	c := &cluster{t: t, st: st, dsn: dsn, pgDSN: dsn, redis: rs, redisA: rs.Addr, rc: rc, pg: pg,
		batch: cmp.Or(opt.batch, batchSize), named: opt.named, binary: binary}
	c.env = append(c.env, opt.backend.settings...)
	if opt.backend.start != nil {
		c.env = append(c.env, opt.backend.start(c)...)
	}
	c.env = append(c.env, opt.env...) // the case's own settings win
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
			r.Signal(syscall.SIGCONT)
			r.Signal(syscall.SIGKILL)
			<-r.Done()
		}
	})
	return c
}

func freeAddr(t *testing.T) string { return testproc.FreeAddr(t) }

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
	r := &replica{i: i, addr: freeAddr(c.t)}
	env := append(os.Environ(),
		"OUTBOXD_POSTGRES_DSN="+c.pgDSN,
		"OUTBOXD_REDIS_ADDRS="+c.redisAddrFor(i),
		"OUTBOXD_DISPATCH_WEBHOOK_URL="+c.rc.URL(),
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
	if c.named {
		env = append(env, "OUTBOXD_INSTANCE_ID="+instanceID(i))
	}
	env = append(env, c.env...) // the last value of a key wins
	var err error
	if r.Process, err = testproc.Start(c.binary, env, &r.out, &r.out, "run"); err != nil {
		c.t.Fatal(err)
	}
	if i < len(c.reps) {
		c.ended = append(c.ended, c.reps[i])
		c.reps[i] = r
	} else {
		c.reps = append(c.reps, r)
	}
}

// pollerTTL is the replicas' poller.lock_ttl: the last value the
// settings give it, else lockTTL.
func (c *cluster) pollerTTL() time.Duration {
	ttl := lockTTL
	for _, kv := range c.env {
		if v, ok := strings.CutPrefix(kv, "OUTBOXD_POLLER_LOCK_TTL="); ok {
			d, err := time.ParseDuration(v)
			if err != nil {
				c.t.Fatalf("%s: %v", kv, err)
			}
			ttl = d
		}
	}
	return ttl
}

// countLogs counts how often s occurs in the logs of every replica,
// ended ones included.
func (c *cluster) countLogs(s string) int {
	n := 0
	for _, r := range append(c.reps, c.ended...) {
		n += strings.Count(r.logs(), s)
	}
	return n
}

// instanceID is replica i's instance_id with options.named.
func instanceID(i int) string { return "replica-" + strconv.Itoa(i) }

func (c *cluster) startAll(n int) {
	for i := range n {
		c.start(i)
	}
}

// hold makes requests for agg wait at the receiver until release.
func (c *cluster) hold(agg string) (release func()) { return c.rc.Hold(testkit.HoldAggregate(agg)) }

// waitHeld waits until the leader has a request held at the receiver (so a
// batch is in flight), then until the receiver has no other request in
// flight: the batch's other aggregates sent so far have been answered.
func (c *cluster) waitHeld() {
	c.t.Helper()
	c.rc.WaitHeld(c.t, 10*time.Second, 1)
	c.rc.Wait(c.t, 10*time.Second, "the held batch's other requests answered", func(reqs []testkit.Request) bool {
		return !testkit.InFlight(reqs)
	})
}

// waitFlowing waits until n deliveries have arrived since since: the
// cluster relays again (after a start or a fault).
func (c *cluster) waitFlowing(since time.Time, n int, limit time.Duration) {
	c.t.Helper()
	c.rc.Wait(c.t, limit, fmt.Sprintf("%d deliveries after %s", n, since.Format(time.TimeOnly)), func(reqs []testkit.Request) bool {
		got := 0
		for i := len(reqs) - 1; i >= 0 && !reqs[i].At.Before(since); i-- {
			if reqs[i].OK() {
				got++
			}
		}
		return got >= n
	})
}

// statusClient times out: a paused replica never answers. A running one
// may take seconds on a loaded machine (its /status asks Postgres and the
// lease's backend).
var statusClient = &http.Client{Timeout: 3 * time.Second}

// waitLimit bounds a wait for a replica's state: long, because a loaded
// machine makes it slower; only a replica that never gets there fails.
const waitLimit = 60 * time.Second

// leader returns the index of the replica whose /status says it leads.
func (c *cluster) leader() int { return c.leaderOtherThan(-1) }

// leaderOtherThan waits until a replica other than not says it leads, and
// returns its index.
func (c *cluster) leaderOtherThan(not int) int {
	c.t.Helper()
	found := -1
	testkit.WaitFor(c.t, waitLimit, "a replica to lead", func() bool {
		for i := range c.reps {
			if held, ok := c.leads(i); i != not && ok && held {
				found = i
				return true
			}
		}
		return false
	}, c.describe)
	return found
}

// describe tells each replica's state and last log lines, for failures.
func (c *cluster) describe() string {
	var b strings.Builder
	for i, r := range c.reps {
		state := "running"
		if r.Exited() {
			state = fmt.Sprintf("exited (%v)", r.Err())
		}
		fmt.Fprintf(&b, "replica %d on %s, %s:\n%s\n", i, r.addr, state, tail(r.logs(), 5))
	}
	return b.String()
}

// leads asks replica i's /status whether it holds the poller lock; ok is
// false when it does not answer (exited, paused, or its Redis is slow).
func (c *cluster) leads(i int) (held, ok bool) {
	r := c.reps[i]
	if r.Exited() {
		return false, false
	}
	resp, err := statusClient.Get("http://" + r.addr + "/status")
	if err != nil {
		return false, false
	}
	defer resp.Body.Close()
	var s struct {
		Locks []struct {
			Name string `json:"name"`
			Held bool   `json:"held_by_this_replica"`
		} `json:"locks"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&s) != nil || len(s.Locks) == 0 {
		return false, false
	}
	return s.Locks[0].Held, true
}

// waitStandby waits until replica i answers /status as a standby: its
// term, if it had one, has ended (written or refused, and released).
func (c *cluster) waitStandby(i int) {
	c.t.Helper()
	testkit.WaitFor(c.t, waitLimit, fmt.Sprintf("replica %d to answer as a standby", i), func() bool {
		held, ok := c.leads(i)
		return ok && !held
	}, func() string { return tail(c.reps[i].logs(), 10) })
}

// waitReady waits until replica i's /readyz answers 200.
func (c *cluster) waitReady(i int) {
	c.t.Helper()
	testkit.WaitFor(c.t, waitLimit, fmt.Sprintf("replica %d ready", i), func() bool {
		resp, err := statusClient.Get("http://" + c.reps[i].addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, func() string { return tail(c.reps[i].logs(), 10) })
}

func (c *cluster) signal(i int, s syscall.Signal) {
	c.t.Helper()
	switch s {
	case syscall.SIGKILL:
		c.reps[i].killed = true
	case syscall.SIGTERM, syscall.SIGINT:
		c.waitCatching(c.reps[i])
	}
	c.reps[i].Signal(s)
}

// waitCatching waits until replica r has written its first log line.
// outboxd catches SIGTERM and SIGINT from before its first line; one sent
// earlier, while the Go runtime and the packages' init still run, ends the
// process by the signal's default action, as it would any program a
// supervisor stops while it execs. A replica restarted by a fault may be
// stopped by the next fault or by stopAll that soon.
func (c *cluster) waitCatching(r *replica) {
	c.t.Helper()
	testkit.WaitFor(c.t, waitLimit, fmt.Sprintf("replica %d's first log line", r.i), func() bool {
		return r.logs() != "" || r.Exited()
	}, func() string { return "no output yet" })
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
	testkit.WaitFor(c.t, timeout, "no row pending", func() bool { return c.pending() == 0 },
		func() string { return fmt.Sprintf("%d rows still pending", c.pending()) })
}

// pending is how many rows are neither delivered nor dead.
func (c *cluster) pending() int {
	c.t.Helper()
	var n int
	if err := c.st.Pool().QueryRow(context.Background(),
		`SELECT count(*) FROM outbox WHERE dispatched_at IS NULL AND dead_at IS NULL`).Scan(&n); err != nil {
		c.t.Fatal(err)
	}
	return n
}

// stopAll sends SIGTERM to every live replica and requires a clean exit.
func (c *cluster) stopAll() {
	c.t.Helper()
	for i, r := range c.reps {
		r.Signal(syscall.SIGCONT)
		c.signal(i, syscall.SIGTERM)
	}
	for _, r := range c.reps {
		select {
		case <-r.Done():
		case <-time.After(20 * time.Second):
			c.t.Fatalf("replica %d did not stop within 20s of SIGTERM", r.i)
		}
	}
}

// report is what a case observed.
type report struct {
	events, delivered, duplicates, dead, tokens, fenceRejected int
}

// pipelineDepth is poller's: a term has at most this many batches
// fetched and not yet written, which a crash may leave sent and unmarked.
const pipelineDepth = 4

// check asserts the invariants; faultAt is when the fault was injected.
func (c *cluster) check(faultAt time.Time, deadAggs map[string]bool) report {
	c.t.Helper()
	ctx := context.Background()
	reqs := c.rc.Requests()
	var rep report

	// Dead rows: only where the case made them.
	dead := map[int64]bool{}
	type deadRow struct {
		ID  int64
		Agg string
	}
	rows, err := c.st.Pool().Query(ctx, `SELECT id, aggregate_type || '/' || aggregate_id FROM outbox WHERE dead_at IS NOT NULL`)
	if err != nil {
		c.t.Fatalf("list dead rows: %v", err)
	}
	deadRows, err := pgx.CollectRows(rows, pgx.RowToStructByPos[deadRow]) // closes rows, then we may fail
	if err != nil {
		c.t.Fatalf("list dead rows: %v", err)
	}
	for _, r := range deadRows {
		if !deadAggs[r.Agg] {
			c.t.Errorf("event %d of %s dead-lettered, unexpected in this case", r.ID, r.Agg)
		}
		dead[r.ID] = true
	}
	rep.dead = len(dead)

	// 0 lost: every committed event delivered at least once (or dead by design).
	ok := c.rc.OKCounts()
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
	for _, v := range testkit.OrderViolations(reqs) {
		c.t.Error(v)
	}

	// After the fault, no delivery carries a token lower than one already seen.
	for _, v := range testkit.TokenViolations(reqs, faultAt) {
		c.t.Error(v)
	}
	rep.tokens = testkit.Tokens(reqs)

	// Duplicates: at most what a term has fetched and not yet written when
	// it ends, per change of leader (the pipeline's bound: pipelineDepth
	// batches).
	if limit := c.batch * pipelineDepth * max(1, rep.tokens-1); rep.duplicates > limit {
		c.t.Errorf("%d duplicates for %d leaders (limit %d)", rep.duplicates, rep.tokens, limit)
	}

	// outbox_fence only rises.
	type fenceWrite struct {
		Lock  string
		Token int64
	}
	frows, err := c.st.Pool().Query(ctx, `SELECT lock_name, token FROM fence_audit ORDER BY seq`)
	if err != nil {
		c.t.Fatalf("fence audit: %v", err)
	}
	fences, err := pgx.CollectRows(frows, pgx.RowToStructByPos[fenceWrite])
	if err != nil {
		c.t.Fatalf("fence audit: %v", err)
	}
	if len(fences) == 0 {
		c.t.Errorf("fence audit is empty: no leader's fence write was recorded")
	}
	prev := map[string]int64{}
	for _, f := range fences {
		if f.Token < prev[f.Lock] {
			c.t.Errorf("outbox_fence %s went back from %d to %d", f.Lock, prev[f.Lock], f.Token)
		}
		prev[f.Lock] = f.Token
	}

	// No replica exited except those the case killed; SIGTERM exits 0.
	for _, r := range append(c.reps, c.ended...) {
		if r.killed {
			continue
		}
		if r.Exited() && r.Err() != nil { // a replica still running has not failed
			c.t.Errorf("replica %d exited with %v; logs:\n%s", r.i, r.Err(), tail(r.logs(), 20))
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

// statusHolder is the poller lock's holder that replica i's /status
// names, once it answers 200.
func (c *cluster) statusHolder(i int) string {
	c.t.Helper()
	var holder, last string
	testkit.WaitFor(c.t, waitLimit, fmt.Sprintf("replica %d's /status", i), func() bool {
		var ok bool
		holder, last, ok = c.readHolder(i)
		return ok
	}, func() string { return last })
	return holder
}

// readHolder reads the poller lock's holder from replica i's /status; ok
// is false, and failure says why, when it does not answer 200.
func (c *cluster) readHolder(i int) (holder, failure string, ok bool) {
	resp, err := statusClient.Get("http://" + c.reps[i].addr + "/status")
	if err != nil {
		return "", err.Error(), false
	}
	defer resp.Body.Close()
	var s struct {
		Locks []struct {
			Name   string `json:"name"`
			Holder string `json:"holder"`
		} `json:"locks"`
	}
	if resp.StatusCode != http.StatusOK {
		return "", resp.Status, false
	}
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		return "", err.Error(), false
	}
	for _, l := range s.Locks {
		if l.Name == pollerLock {
			return l.Holder, "", true
		}
	}
	return "", "", true
}
