package nats

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/internal/testkit"
)

// The machine's NATS server (JetStream on); tests that stop, pause or
// reconfigure a server start their own nats-server process.
var sharedURL = cmp.Or(os.Getenv("OUTBOXD_TEST_NATS_URL"), "nats://127.0.0.1:4222")

func TestMain(m *testing.M) {
	testkit.VerifyTestMain(m)
}

// waitLimit bounds every wait for a condition.
const waitLimit = 20 * time.Second

func randomID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// testStream is a stream of a test's own, capturing "<prefix>.>", deleted
// at cleanup.
type testStream struct {
	prefix string // subject prefix
	name   string
	js     jetstream.JetStream
}

// newStream creates a memory stream on the server at url; edit changes
// its config before creation.
func newStream(t *testing.T, url string, edit func(*jetstream.StreamConfig)) *testStream {
	t.Helper()
	id := randomID()
	ts := &testStream{prefix: "t" + id, name: "T" + strings.ToUpper(id), js: jetStreamOf(t, url)}
	cfg := jetstream.StreamConfig{Name: ts.name, Subjects: []string{ts.prefix + ".>"}, Storage: jetstream.MemoryStorage}
	if edit != nil {
		edit(&cfg)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := ts.js.CreateStream(ctx, cfg); err != nil {
		t.Fatalf("create stream %s: %v", ts.name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 10*time.Second)
		defer cancel()
		_ = ts.js.DeleteStream(ctx, ts.name)
	})
	return ts
}

// jetStreamOf is a test's own connection (closed at cleanup).
func jetStreamOf(t testing.TB, url string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatalf("connect to %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// messages are the stream's stored messages in sequence order.
func (ts *testStream) messages(t *testing.T) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	st, err := ts.js.Stream(ctx, ts.name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	if info.State.Msgs == 0 {
		return nil
	}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("stream %s seq %d: %v", ts.name, seq, err)
		}
		out = append(out, m)
	}
	return out
}

// count is how many messages the stream holds.
func (ts *testStream) count(t *testing.T) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	st, err := ts.js.Stream(ctx, ts.name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// newSink builds a sink logging (JSON, debug) to the test and to the
// returned buffer, closed at cleanup.
func newSink(t *testing.T, cfg Config) (*Sink, *testkit.Logs) {
	t.Helper()
	logs := &testkit.Logs{}
	cfg.Log = slog.New(slog.NewJSONHandler(io.MultiWriter(logs, testkit.Writer(t)), &slog.HandlerOptions{Level: slog.LevelDebug}))
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, logs
}

var created = time.Date(2024, 5, 6, 7, 8, 9, 123456789, time.UTC)

// event is a small event of aggregate aggType/aggID.
func event(id int64, aggType, aggID string) dispatch.Event {
	return dispatch.Event{ID: id, AggregateType: aggType, AggregateID: aggID, EventType: aggType + ".happened",
		Payload: json.RawMessage(fmt.Sprintf(`{"n": %d}`, id)), Headers: json.RawMessage(`{}`), CreatedAt: created}
}

// batch is events with fencing token 7 and a deadline far enough away.
func batch(events ...dispatch.Event) dispatch.Batch {
	until := time.Now().Add(30 * time.Second)
	return dispatch.Batch{Events: events, Token: 7, Until: func() time.Time { return until }}
}

// outcomes lists results as "outcome" strings, for comparisons.
func outcomes(rs []dispatch.Result) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.Outcome.String()
	}
	return out
}

func describe(rs []dispatch.Result) string {
	var b strings.Builder
	for i, r := range rs {
		fmt.Fprintf(&b, "%d: %s ref=%q cut=%v err=%v\n", i, r.Outcome, r.Ref, r.Cut, r.Err)
	}
	return b.String()
}

func wantOutcomes(t *testing.T, rs []dispatch.Result, want ...dispatch.Outcome) {
	t.Helper()
	if len(rs) != len(want) {
		t.Fatalf("got %d results, want %d:\n%s", len(rs), len(want), describe(rs))
	}
	for i := range want {
		if rs[i].Outcome != want[i] {
			t.Fatalf("result %d is %s, want %s; all:\n%s", i, rs[i].Outcome, want[i], describe(rs))
		}
	}
}

// ---- a nats-server process of the test's own ----

// natsServer is a nats-server process with JetStream on a free loopback
// port; it can be stopped, restarted (same port and store) and paused.
type natsServer struct {
	t    *testing.T
	port int
	dir  string
	conf string // optional config file
	cmd  *exec.Cmd
	done chan struct{}
	logs *testkit.Logs
}

// serverBinary is nats-server: OUTBOXD_TEST_NATS_SERVER, or on PATH, or
// where the distribution package puts it.
func serverBinary(t *testing.T) string {
	if p := os.Getenv("OUTBOXD_TEST_NATS_SERVER"); p != "" {
		return p
	}
	if p, err := exec.LookPath("nats-server"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/sbin/nats-server"); err == nil {
		return "/usr/sbin/nats-server"
	}
	t.Fatal("nats-server not found: install it (apt-get install nats-server) or set OUTBOXD_TEST_NATS_SERVER")
	return ""
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// newServer prepares a server on a free port (not started); conf, if not
// empty, is written to a config file it reads.
func newServer(t *testing.T, conf string) *natsServer {
	s := &natsServer{t: t, port: freePort(t), dir: t.TempDir()}
	if conf != "" {
		s.conf = filepath.Join(s.dir, "nats.conf")
		if err := os.WriteFile(s.conf, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(s.stop)
	return s
}

func (s *natsServer) URL() string { return "nats://127.0.0.1:" + strconv.Itoa(s.port) }

// start runs the server and waits until it says it is ready.
func (s *natsServer) start() {
	s.t.Helper()
	args := []string{"-js", "-sd", filepath.Join(s.dir, "store"), "-a", "127.0.0.1", "-p", strconv.Itoa(s.port)}
	if s.conf != "" {
		args = append(args, "-c", s.conf)
	}
	s.logs = &testkit.Logs{}
	s.cmd = exec.Command(serverBinary(s.t), args...)
	s.cmd.Stdout, s.cmd.Stderr = s.logs, s.logs
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) {
		_ = cmd.Wait()
		close(done)
	}(s.cmd, s.done)
	s.logs.WaitLine(s.t, waitLimit, "Server is ready")
}

// stop ends the server (SIGTERM; SIGKILL after 10 s) and waits for it.
func (s *natsServer) stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGCONT) // in case it was paused
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	s.cmd = nil
}

// pause stops the process (SIGSTOP) and waits until every thread of it is
// stopped: the signal takes effect asynchronously.
func (s *natsServer) pause() {
	s.t.Helper()
	_ = s.cmd.Process.Signal(syscall.SIGSTOP)
	pid := strconv.Itoa(s.cmd.Process.Pid)
	testkit.WaitFor(s.t, waitLimit, "nats-server stopped", func() bool {
		stats, _ := filepath.Glob("/proc/" + pid + "/task/*/stat")
		for _, f := range stats {
			b, err := os.ReadFile(f)
			if err != nil {
				return false
			}
			// "pid (comm) state ...": the state follows the last ')'.
			i := strings.LastIndexByte(string(b), ')')
			if i < 0 || i+2 >= len(b) || b[i+2] != 'T' {
				return false
			}
		}
		return len(stats) > 0
	}, nil)
}

func (s *natsServer) resume() { _ = s.cmd.Process.Signal(syscall.SIGCONT) }
