// Package blackbox drives the built outboxd binary the way users run it
// (`outboxd run`, configured by OUTBOXD_<SECTION>_<KEY>) against real
// Postgres and Redis, hostile webhook receivers, poison rows and poison Redis
// values, and asserts outcomes in Postgres, Redis, the receiver and the JSON
// log lines. Each test has its own
// database, Redis key prefix, ports and replica process.
package blackbox

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/internal/testkit"
	"github.com/outboxd/outboxd/internal/testproc"
)

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "outboxd-blackbox")
	if err != nil {
		panic(err)
	}
	// No -race: the memory test reads the relay's real peak RSS.
	binary, err = testproc.Build(dir, "outboxd", false)
	if err != nil {
		_ = os.RemoveAll(dir)
		fmt.Fprintf(os.Stderr, "blackbox: %v\n", err)
		os.Exit(1)
	}
	code := testenv.Run(m)
	_ = os.RemoveAll(dir) // not deferred: os.Exit skips defers
	os.Exit(code)
}

// waitTimeout bounds every wait for a condition.
const waitTimeout = 20 * time.Second

// baseEnv is every test's replica configuration; tests override keys.
func baseEnv() map[string]string {
	return map[string]string{
		"OUTBOXD_POLLER_LOCK_TTL":          "2s",
		"OUTBOXD_POLLER_LOCK_WAIT":         "300ms",
		"OUTBOXD_POLLER_POLL_INTERVAL":     "20ms",
		"OUTBOXD_POLLER_BACKOFF_BASE":      "50ms",
		"OUTBOXD_POLLER_BACKOFF_MAX":       "1s",
		"OUTBOXD_DISPATCH_WEBHOOK_TIMEOUT": "1s",
		"OUTBOXD_RECONCILE_SCHEDULE":       "@every 1h",
		"OUTBOXD_SHUTDOWN_TIMEOUT":         "3s",
	}
}

// testBundle is a test's database, Redis prefix and the environment for the binary.
type testBundle struct {
	t      *testing.T
	pool   *pgxpool.Pool
	dsn    string
	rdb    *redis.Client
	prefix string
	vars   map[string]string
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	st, dsn := testenv.Store(t)
	return envOn(t, st.Pool(), dsn)
}

// envOn is setup on a database of the caller's (migrated).
func envOn(t *testing.T, pool *pgxpool.Pool, dsn string) *testBundle {
	t.Helper()
	rdb, prefix := testenv.Redis(t)
	vars := baseEnv()
	vars["OUTBOXD_POSTGRES_DSN"] = dsn
	vars["OUTBOXD_REDIS_ADDRS"] = testenv.RedisAddr()
	vars["OUTBOXD_REDIS_KEY_PREFIX"] = prefix
	vars["OUTBOXD_HTTP_ADDR"] = freeAddr(t)
	return &testBundle{t: t, pool: pool, dsn: dsn, rdb: rdb, prefix: prefix, vars: vars}
}

// set overrides environment variables: key, value, key, value...
func (e *testBundle) set(kv ...string) *testBundle {
	for i := 0; i+1 < len(kv); i += 2 {
		e.vars[kv[i]] = kv[i+1]
	}
	return e
}

// environ is the process environment without the caller's OUTBOXD_* settings
// (they would change what is tested), plus vars.
func environ(vars map[string]string) []string { return testproc.Environ(vars) }

func freeAddr(t *testing.T) string { return testproc.FreeAddr(t) }

// replica is one `outboxd run` process.
type replica struct {
	t      *testing.T
	addr   string
	proc   *testproc.Process
	out    testkit.Logs // stdout, one JSON log line each
	stderr testkit.Logs
	killed bool // by kill: its exit status is not checked
}

// start launches `outboxd run` (with the extra arguments, e.g. --config)
// with e's environment, waits until /readyz answers 200, and at cleanup
// sends SIGTERM and requires exit 0.
func (e *testBundle) start(extra ...string) *replica {
	e.t.Helper()
	return e.startVia(nil, extra...)
}

// startVia is start with the binary run by a launcher: launcher's first
// element is run with the rest, then the binary and its arguments.
func (e *testBundle) startVia(launcher []string, extra ...string) *replica {
	t := e.t
	t.Helper()
	r := &replica{t: t, addr: e.vars["OUTBOXD_HTTP_ADDR"]}
	bin, args := binary, append([]string{"run"}, extra...)
	if len(launcher) > 0 {
		bin, args = launcher[0], append(append(slices.Clone(launcher[1:]), binary), args...)
	}
	var err error
	if r.proc, err = testproc.Start(bin, environ(e.vars), &r.out, &r.stderr, args...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.stop)
	r.waitReady()
	return r
}

func (r *replica) exited() bool { return r.proc.Exited() }

func (r *replica) waitReady() {
	r.t.Helper()
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(waitTimeout)
	for time.Now().Before(deadline) {
		if r.exited() {
			r.t.Fatalf("outboxd run exited before it was ready: %v\nstderr: %s\nlogs:\n%s", r.proc.Err(), r.stderrText(), r.tail(20))
		}
		if testproc.Ready(client, r.addr) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.t.Fatalf("outboxd run not ready on %s within %s; logs:\n%s", r.addr, waitTimeout, r.tail(20))
}

// kill ends the process with SIGKILL (a crash: nothing is released) and
// waits for it.
func (r *replica) kill() {
	r.killed = true
	r.proc.Signal(syscall.SIGKILL)
	<-r.proc.Done()
}

// stop sends SIGTERM and requires a clean exit.
func (r *replica) stop() {
	if r.killed {
		return
	}
	switch err := r.proc.Stop(15 * time.Second); {
	case errors.Is(err, testproc.ErrStopTimeout):
		r.t.Errorf("outboxd run did not exit within 15s of SIGTERM; logs:\n%s", r.tail(20))
		return
	case err != nil:
		r.t.Errorf("outboxd run exited with %v after SIGTERM (want 0); stderr: %s\nlogs:\n%s", err, r.stderrText(), r.tail(20))
	}
	// The contract: stdout is one JSON object per line, whatever happened.
	if bad := r.logsMatching(func(_ string, rec map[string]any) bool { return rec == nil }); len(bad) > 0 {
		r.t.Errorf("%d stdout line(s) are not JSON objects, first: %q", len(bad), trunc(bad[0], 300))
	}
}

func (r *replica) stderrText() string { return r.stderr.String() }

func (r *replica) tail(n int) string { return r.out.Tail(n) }

// logsMatching returns the log lines for which match is true; match gets
// each line parsed (nil when it is not a JSON object).
func (r *replica) logsMatching(match func(line string, rec map[string]any) bool) []string {
	var out []string
	for _, l := range r.out.Lines() {
		if matchRecord(l, match) {
			out = append(out, l)
		}
	}
	return out
}

// awaitLog waits up to limit for a log line match accepts, woken by each
// new line, and reports whether one came.
func (r *replica) awaitLog(limit time.Duration, match func(line string, rec map[string]any) bool) bool {
	_, ok := r.out.Await(limit, 1, func(l string) bool { return matchRecord(l, match) })
	return ok
}

func matchRecord(line string, match func(line string, rec map[string]any) bool) bool {
	var rec map[string]any
	if json.Unmarshal([]byte(line), &rec) != nil {
		rec = nil
	}
	return match(line, rec)
}

// peakRSS is the process' VmHWM in bytes.
func (r *replica) peakRSS() int64 {
	r.t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", r.proc.Pid()))
	if err != nil {
		r.t.Fatalf("read peak RSS: %v", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				r.t.Fatalf("VmHWM %q: %v", l, err)
			}
			return kb << 10
		}
	}
	r.t.Fatalf("no VmHWM in /proc/%d/status", r.proc.Pid())
	return 0
}

// result is one run of the binary to completion.
type result struct {
	code           int
	stdout, stderr string
	timedOut       bool // killed after the limit: it did not exit by itself
}

func (res result) String() string {
	return fmt.Sprintf("exit %d (timed out: %v)\nstdout: %s\nstderr: %s", res.code, res.timedOut, trunc(res.stdout, 800), trunc(res.stderr, 800))
}

// runBinary runs outboxd with args and vars, killing it after limit.
func runBinary(t *testing.T, vars map[string]string, limit time.Duration, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = environ(vars)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := result{stdout: stdout.String(), stderr: stderr.String(), timedOut: ctx.Err() != nil}
	if exit, ok := err.(*exec.ExitError); ok {
		res.code = exit.ExitCode()
	} else if err != nil {
		t.Fatalf("run outboxd %v: %v", args, err)
	}
	return res
}

// ---- Postgres ----

// insert adds one row as any producer would and returns its id. headers may
// be "" for the default.
func (e *testBundle) insert(aggType, aggID, payload, headers string) int64 {
	e.t.Helper()
	if headers == "" {
		headers = "{}"
	}
	var id int64
	err := e.pool.QueryRow(context.Background(),
		`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
		 VALUES ($1, $2, 'test.event', $3::jsonb, $4::jsonb) RETURNING id`,
		aggType, aggID, payload, headers).Scan(&id)
	if err != nil {
		e.t.Fatalf("insert %s/%s: %v", aggType, aggID, err)
	}
	return id
}

// insertMany adds n small rows per aggregate "<aggType>/<i>" for i < aggs
// and returns their ids.
func (e *testBundle) insertMany(aggType string, aggs, n int) []int64 {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(),
		`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		 SELECT $1, (g % $2::int)::text, 'test.event', jsonb_build_object('n', g)
		 FROM generate_series(0, $2::int * $3::int - 1) g ORDER BY g RETURNING id`, aggType, aggs, n)
	if err != nil {
		e.t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		e.t.Fatal(err)
	}
	return ids
}

// row is an outbox row's delivery state.
type row struct {
	ID          int64
	Agg         string
	Attempts    int
	LastError   string
	Dispatched  bool
	Dead        bool
	AvailableAt time.Time
}

func (w row) settled() bool { return w.Dispatched || w.Dead }

func (w row) String() string {
	return fmt.Sprintf("row %d (%s): attempts %d dispatched %v dead %v last_error %q",
		w.ID, w.Agg, w.Attempts, w.Dispatched, w.Dead, trunc(w.LastError, 300))
}

// rows reads the rows matching where (SQL over outbox, $1... from args).
func (e *testBundle) rows(where string, args ...any) []row {
	e.t.Helper()
	rs, err := e.pool.Query(context.Background(),
		`SELECT id, aggregate_type || '/' || aggregate_id, attempts, coalesce(last_error, ''),
		        dispatched_at IS NOT NULL, dead_at IS NOT NULL, available_at
		 FROM outbox WHERE `+where+` ORDER BY id`, args...)
	if err != nil {
		e.t.Fatalf("read rows: %v", err)
	}
	defer rs.Close()
	var out []row
	for rs.Next() {
		var w row
		if err := rs.Scan(&w.ID, &w.Agg, &w.Attempts, &w.LastError, &w.Dispatched, &w.Dead, &w.AvailableAt); err != nil {
			e.t.Fatal(err)
		}
		out = append(out, w)
	}
	return out
}

func (e *testBundle) row(id int64) row {
	e.t.Helper()
	rs := e.rows("id = $1", id)
	if len(rs) != 1 {
		e.t.Fatalf("row %d not found", id)
	}
	return rs[0]
}

// waitFor polls cond until it holds or waitTimeout passes; then the test
// fails with what describe says about the state.
func waitFor(t *testing.T, what string, cond func() bool, describe func() string) {
	t.Helper()
	testkit.WaitFor(t, waitTimeout, what, cond, describe)
}

// describeRows lists the rows matching where, for failure messages.
func (e *testBundle) describeRows(where string, args ...any) func() string {
	return func() string {
		var b strings.Builder
		for _, w := range e.rows(where, args...) {
			b.WriteString(w.String() + "\n")
		}
		return b.String()
	}
}

// count is how many rows match where.
func (e *testBundle) count(where string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE `+where, args...).Scan(&n); err != nil {
		e.t.Fatalf("count: %v", err)
	}
	return n
}

// ---- receivers ----

// newRecorder is a testkit.Receiver answering as respond says (nil: 204).
func newRecorder(t *testing.T, respond func(req testkit.Request) testkit.Reply) *testkit.Receiver {
	rc := testkit.NewReceiver(t)
	rc.SetRespond(respond)
	return rc
}

// aggOf reads a webhook body's aggregate ("" if it is not an event).
func aggOf(body []byte) string {
	var ev struct {
		AggregateType string `json:"aggregate_type"`
		AggregateID   string `json:"aggregate_id"`
	}
	if json.Unmarshal(body, &ev) != nil {
		return ""
	}
	return ev.AggregateType + "/" + ev.AggregateID
}

// rawReceiver speaks HTTP/1.1 by hand so it can send status lines Go's
// server never would. answer returns the raw response bytes for an aggregate.
type rawReceiver struct {
	ln     net.Listener
	answer func(agg string) string
	mu     sync.Mutex
	conns  map[net.Conn]bool
	hits   map[string]int // requests per aggregate
	wg     sync.WaitGroup
}

func newRawReceiver(t *testing.T, answer func(agg string) string) *rawReceiver {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rr := &rawReceiver{ln: ln, answer: answer, conns: map[net.Conn]bool{}, hits: map[string]int{}}
	rr.wg.Go(rr.accept)
	t.Cleanup(func() {
		_ = ln.Close()
		rr.mu.Lock()
		for c := range rr.conns {
			_ = c.Close()
		}
		rr.mu.Unlock()
		rr.wg.Wait()
	})
	return rr
}

func (rr *rawReceiver) URL() string { return "http://" + rr.ln.Addr().String() + "/events" }

func (rr *rawReceiver) accept() {
	for {
		c, err := rr.ln.Accept()
		if err != nil {
			return
		}
		rr.mu.Lock()
		rr.conns[c] = true
		rr.mu.Unlock()
		rr.wg.Go(func() { rr.serve(c) })
	}
}

// serve answers requests on one keep-alive connection until it closes.
func (rr *rawReceiver) serve(c net.Conn) {
	defer func() {
		rr.mu.Lock()
		delete(rr.conns, c)
		rr.mu.Unlock()
		_ = c.Close()
	}()
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return
		}
		agg := aggOf(body)
		rr.mu.Lock()
		rr.hits[agg]++
		rr.mu.Unlock()
		if _, err := io.WriteString(c, rr.answer(agg)); err != nil {
			return
		}
	}
}

func (rr *rawReceiver) hitsFor(agg string) int {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	return rr.hits[agg]
}

func trunc(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// payloads maps each row's id to its payload as Postgres renders it (what
// the relay reads and must pass on byte for byte).
func (e *testBundle) payloads(where string) map[int64]string {
	e.t.Helper()
	rs, err := e.pool.Query(context.Background(), `SELECT id, payload::text FROM outbox WHERE `+where)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rs.Close()
	out := map[int64]string{}
	for rs.Next() {
		var id int64
		var p string
		if err := rs.Scan(&id, &p); err != nil {
			e.t.Fatal(err)
		}
		out[id] = p
	}
	return out
}

// consumedOnce checks that every dispatched id was found at the
// destination (seen counts each id's copies there) and returns how many
// arrived more than once (allowed: at least once, consumers dedupe).
func consumedOnce(t *testing.T, ids []int64, seen map[int64]int, where string) (dups int) {
	t.Helper()
	for _, id := range ids {
		switch n := seen[id]; {
		case n == 0:
			t.Errorf("event %d dispatched but not in %s", id, where)
		case n > 1:
			dups++
		}
	}
	return dups
}
