// Package blackbox drives the built outboxd binary the way users run it
// (`outboxd run`, configured by OUTBOXD_<SECTION>_<KEY>) against real
// Postgres and Redis, hostile webhook receivers, poison rows and poison Redis
// values, and asserts outcomes in Postgres, Redis, the receiver and the JSON
// log lines. One test per finding of issue 10; each test has its own
// database, Redis key prefix, ports and replica process.
package blackbox

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/outboxd/outboxd/internal/testenv"
)

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "outboxd-blackbox")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "outboxd")
	// No -race: the memory test reads the relay's real peak RSS.
	out, err := exec.Command("go", "build", "-o", binary, "../../cmd/outboxd").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "blackbox: build outboxd: %v\n%s", err, out)
		os.Exit(1)
	}
	defer os.RemoveAll(dir)
	testenv.Main(m)
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

// env is a test's database, Redis prefix and the environment for the binary.
type env struct {
	t      *testing.T
	pool   *pgxpool.Pool
	dsn    string
	rdb    *redis.Client
	prefix string
	vars   map[string]string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	st, dsn := testenv.Store(t)
	rdb, prefix := testenv.Redis(t)
	vars := baseEnv()
	vars["OUTBOXD_POSTGRES_DSN"] = dsn
	vars["OUTBOXD_REDIS_ADDRS"] = testenv.RedisAddr()
	vars["OUTBOXD_REDIS_KEY_PREFIX"] = prefix
	vars["OUTBOXD_HTTP_ADDR"] = freeAddr(t)
	return &env{t: t, pool: st.Pool(), dsn: dsn, rdb: rdb, prefix: prefix, vars: vars}
}

// set overrides environment variables: key, value, key, value...
func (e *env) set(kv ...string) *env {
	for i := 0; i+1 < len(kv); i += 2 {
		e.vars[kv[i]] = kv[i+1]
	}
	return e
}

// environ is the process environment without the caller's OUTBOXD_* settings
// (they would change what is tested), plus vars.
func environ(vars map[string]string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OUTBOXD_") {
			out = append(out, kv)
		}
	}
	for k, v := range vars {
		out = append(out, k+"="+v)
	}
	return out
}

func freeAddr(t *testing.T) string {
	return "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
}

// replica is one `outboxd run` process.
type replica struct {
	t       *testing.T
	addr    string
	cmd     *exec.Cmd
	mu      sync.Mutex
	lines   []string // stdout, one JSON log line each
	stderr  bytes.Buffer
	done    chan struct{}
	waitErr error
}

// start launches `outboxd run` with e's environment, waits until /readyz
// answers 200, and at cleanup sends SIGTERM and requires exit 0.
func (e *env) start() *replica {
	t := e.t
	t.Helper()
	r := &replica{t: t, addr: e.vars["OUTBOXD_HTTP_ADDR"], done: make(chan struct{})}
	r.cmd = exec.Command(binary, "run")
	r.cmd.Env = environ(e.vars)
	r.cmd.Stderr = &lockedWriter{mu: &r.mu, w: &r.stderr}
	stdout, err := r.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			r.mu.Lock()
			r.lines = append(r.lines, sc.Text())
			r.mu.Unlock()
		}
		_, _ = io.Copy(io.Discard, stdout) // a line above 16 MiB: keep draining
		r.waitErr = r.cmd.Wait()
		close(r.done)
	}()
	t.Cleanup(r.stop)
	r.waitReady()
	return r
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (r *replica) exited() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

func (r *replica) waitReady() {
	r.t.Helper()
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(waitTimeout)
	for time.Now().Before(deadline) {
		if r.exited() {
			r.t.Fatalf("outboxd run exited before it was ready: %v\nstderr: %s\nlogs:\n%s", r.waitErr, r.stderrText(), r.tail(20))
		}
		resp, err := client.Get("http://" + r.addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.t.Fatalf("outboxd run not ready on %s within %s; logs:\n%s", r.addr, waitTimeout, r.tail(20))
}

// stop sends SIGTERM and requires a clean exit.
func (r *replica) stop() {
	if !r.exited() {
		_ = r.cmd.Process.Signal(syscall.SIGTERM)
	}
	select {
	case <-r.done:
	case <-time.After(15 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.done
		r.t.Errorf("outboxd run did not exit within 15s of SIGTERM; logs:\n%s", r.tail(20))
		return
	}
	if r.waitErr != nil {
		r.t.Errorf("outboxd run exited with %v after SIGTERM (want 0); stderr: %s\nlogs:\n%s", r.waitErr, r.stderrText(), r.tail(20))
	}
	// The contract: stdout is one JSON object per line, whatever happened.
	if bad := r.logsMatching(func(_ string, rec map[string]any) bool { return rec == nil }); len(bad) > 0 {
		r.t.Errorf("%d stdout line(s) are not JSON objects, first: %q", len(bad), trunc(bad[0], 300))
	}
}

func (r *replica) logLines() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.lines...)
}

func (r *replica) stderrText() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stderr.String()
}

func (r *replica) tail(n int) string {
	lines := r.logLines()
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// logsMatching returns the parsed log lines for which match is true.
func (r *replica) logsMatching(match func(line string, rec map[string]any) bool) []string {
	var out []string
	for _, l := range r.logLines() {
		var rec map[string]any
		if json.Unmarshal([]byte(l), &rec) != nil {
			rec = nil
		}
		if match(l, rec) {
			out = append(out, l)
		}
	}
	return out
}

// peakRSS is the process' VmHWM in bytes.
func (r *replica) peakRSS() int64 {
	r.t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", r.cmd.Process.Pid))
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
	r.t.Fatalf("no VmHWM in /proc/%d/status", r.cmd.Process.Pid)
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
func (e *env) insert(aggType, aggID, payload, headers string) int64 {
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
func (e *env) insertMany(aggType string, aggs, n int) []int64 {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(),
		`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		 SELECT $1, (g % $2::int)::text, 'test.event', jsonb_build_object('n', g)
		 FROM generate_series(0, $2::int * $3::int - 1) g ORDER BY g RETURNING id`, aggType, aggs, n)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			e.t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
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
func (e *env) rows(where string, args ...any) []row {
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

func (e *env) row(id int64) row {
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
	waitWithin(t, waitTimeout, what, cond, describe)
}

// waitWithin is waitFor with its own limit.
func waitWithin(t *testing.T, limit time.Duration, what string, cond func() bool, describe func() string) {
	t.Helper()
	if !pollUntil(limit, cond) {
		t.Fatalf("after %s, still waiting for %s; state:\n%s", limit, what, describe())
	}
}

// pollUntil reports whether cond held within limit.
func pollUntil(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(25 * time.Millisecond)
	}
	return true
}

// describeRows lists the rows matching where, for failure messages.
func (e *env) describeRows(where string, args ...any) func() string {
	return func() string {
		var b strings.Builder
		for _, w := range e.rows(where, args...) {
			b.WriteString(w.String() + "\n")
		}
		return b.String()
	}
}

// count is how many rows match where.
func (e *env) count(where string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE `+where, args...).Scan(&n); err != nil {
		e.t.Fatalf("count: %v", err)
	}
	return n
}

// ---- receivers ----

// request is one request a recorder received.
type request struct {
	Method  string
	Path    string
	Header  http.Header
	Body    []byte // up to bodyKeep bytes
	BodyLen int
	At      time.Time
	ID      int64  // the event's id, from the body
	Agg     string // aggregate_type/aggregate_id, from the body
}

// bodyKeep is how much of each body a recorder keeps: enough for any small
// event, not the 10 MB ones.
const bodyKeep = 64 << 10

// reply is what a recorder answers.
type reply struct {
	code   int
	header map[string]string
	hang   bool // never answer (until the client gives up or the test ends)
}

// recorder is an httptest server that records every request and answers
// as its respond function says (nil: 204). nth counts requests for this
// event id, from 1.
type recorder struct {
	srv     *httptest.Server
	quit    chan struct{}
	mu      sync.Mutex
	reqs    []request
	perID   map[int64]int
	respond func(req request, nth int) reply
}

func newRecorder(t *testing.T, respond func(req request, nth int) reply) *recorder {
	rc := &recorder{quit: make(chan struct{}), perID: map[int64]int{}, respond: respond}
	rc.srv = httptest.NewServer(rc)
	t.Cleanup(func() {
		close(rc.quit) // release hanging handlers: Close waits for them
		rc.srv.Close()
	})
	return rc
}

func (rc *recorder) URL() string { return rc.srv.URL + "/events" }

func (rc *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	req := request{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(), BodyLen: len(body), At: time.Now()}
	req.Body = body[:min(len(body), bodyKeep)]
	req.ID, req.Agg = eventOf(body)
	rc.mu.Lock()
	rc.perID[req.ID]++
	nth := rc.perID[req.ID]
	rc.reqs = append(rc.reqs, req)
	rc.mu.Unlock()
	rep := reply{code: http.StatusNoContent}
	if rc.respond != nil {
		rep = rc.respond(req, nth)
	}
	if rep.hang {
		select {
		case <-r.Context().Done():
		case <-rc.quit:
		}
		return
	}
	for k, v := range rep.header {
		w.Header().Set(k, v)
	}
	w.WriteHeader(rep.code)
}

func (rc *recorder) requests() []request {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]request(nil), rc.reqs...)
}

// eventOf reads the webhook body's id and aggregate; zero values if it is
// not an event.
func eventOf(body []byte) (int64, string) {
	var ev struct {
		ID            int64  `json:"id"`
		AggregateType string `json:"aggregate_type"`
		AggregateID   string `json:"aggregate_id"`
	}
	if json.Unmarshal(body, &ev) != nil {
		return 0, ""
	}
	return ev.ID, ev.AggregateType + "/" + ev.AggregateID
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
		_, agg := eventOf(body)
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
