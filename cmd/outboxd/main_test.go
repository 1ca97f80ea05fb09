package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestExitCodes(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string // in stderr
	}{
		{"bad duration", []string{"run", "--set", "poller.poll_interval=10 parsecs"}, 2, "poller.poll_interval"},
		{"bad cron", []string{"run", "--set", "reconcile.schedule=* * *"}, 2, "reconcile.schedule"},
		{"bad retention", []string{"reconcile", "--once", "--set", "reconcile.retention=a week"}, 2, "reconcile.retention"},
		{"reconcile without --once", []string{"reconcile"}, 2, "--once"},
		{"replay without --dead", []string{"replay"}, 2, "--dead"},
		{"bad aggregate", []string{"replay", "--dead", "--aggregate", "deal"}, 2, "TYPE/ID"},
		{"negative batch size", []string{"run", "--set", "poller.batch_size=-1"}, 2, "poller.batch_size"},
		{"missing config file", []string{"migrate", "--config", "/nonexistent/outboxd.yaml"}, 2, "/nonexistent/outboxd.yaml"},
		{"unknown flag", []string{"run", "--frobnicate"}, 2, "frobnicate"},
		{"unknown command", []string{"frobnicate"}, 2, "frobnicate"},
		{"stray argument", []string{"run", "now"}, 2, "no arguments"},
		{"version", []string{"version"}, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(tc.args, &out, &errb)
			if code != tc.code || !strings.Contains(errb.String(), tc.want) {
				t.Fatalf("exit %d stderr %q, want exit %d naming %q", code, errb.String(), tc.code, tc.want)
			}
		})
	}
}

// With Redis unreachable, the real binary keeps stdout one JSON object per
// line, reports the outage there, and writes nothing else to stderr.
func TestLogsStayJSONWhenRedisIsDown(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "outboxd")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	down := testenv.StartRedisServer(t)
	down.Stop()
	cmd := exec.Command(bin, "run")
	cmd.Env = append(os.Environ(), "OUTBOXD_POSTGRES_DSN="+testenv.DSN(t), "OUTBOXD_REDIS_ADDRS="+down.Addr,
		"OUTBOXD_HTTP_ADDR=127.0.0.1:"+strconv.Itoa(testenv.FreePort(t)), "OUTBOXD_POLLER_LOCK_WAIT=200ms")
	var stdout, stderr syncBuffer // exec copies into them from its own goroutines
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	// Several failed attempts: go-redis logs after repeated failed dials.
	for strings.Count(stdout.String(), `"msg":"lock attempt failed"`) < 4 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v\nstderr: %s", err, stderr.String())
	}
	if stderr.String() != "" {
		t.Fatalf("stderr is not empty:\n%s", stderr.String())
	}
	if !strings.Contains(stdout.String(), "redis "+down.Addr) {
		t.Fatalf("the outage is not reported with the Redis address:\n%s", stdout.String())
	}
	for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		if !json.Valid([]byte(line)) {
			t.Fatalf("stdout line is not JSON: %s", line)
		}
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
