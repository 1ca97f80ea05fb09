package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/app"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/internal/testkit"
)

func TestMain(m *testing.M) {
	code := testenv.Run(m)
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// binDir holds the binary built by buildBinary, removed after the tests.
var binDir string

// built builds this command once, for the tests that run it as users do.
var built = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "outboxd-cmd-test")
	if err != nil {
		return "", err
	}
	binDir = dir
	bin := filepath.Join(dir, "outboxd")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		return "", fmt.Errorf("build: %w\n%s", err, out)
	}
	return bin, nil
})

func TestExitCodes(t *testing.T) {
	t.Parallel()
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
		{"bad aggregate", []string{"replay", "--dead", "--aggregate", "deal/"}, 2, "TYPE/ID"},
		{"negative batch size", []string{"run", "--set", "poller.batch_size=-1"}, 2, "poller.batch_size"},
		{"bad cloudevents mode", []string{"run", "--set", "dispatch.cloudevents=true", "--set", "dispatch.cloudevents_mode=batched"}, 2, "dispatch.cloudevents_mode"},
		{"missing config file", []string{"migrate", "--config", "/nonexistent/outboxd.yaml"}, 2, "/nonexistent/outboxd.yaml"},
		{"missing config file named as --config", []string{"config", "--config", "/nonexistent/outboxd.yaml"}, 2, "--config"},
		{"discard without a filter", []string{"dead", "discard"}, 2, "--all"},
		{"discard dry run without a filter", []string{"dead", "discard", "--dry-run"}, 2, "--all"},
		{"unknown flag", []string{"run", "--frobnicate"}, 2, "frobnicate"},
		{"unknown command", []string{"frobnicate"}, 2, "frobnicate"},
		{"stray argument", []string{"run", "now"}, 2, "no arguments"},
		{"version", []string{"version"}, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var out, errb bytes.Buffer
			code := run(tc.args, &out, &errb)
			if code != tc.code || !strings.Contains(errb.String(), tc.want) {
				t.Fatalf("exit %d stderr %q, want exit %d naming %q", code, errb.String(), tc.code, tc.want)
			}
		})
	}
}

// buildBinary returns this command built (once for all tests).
func buildBinary(t *testing.T) string {
	t.Helper()
	bin, err := built()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// badSecrets are settings that cannot work and the secret text
// that must not appear in the error.
func badSecrets(t *testing.T) []struct {
	name, key, secret string
	sets              []string
} {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	blank := filepath.Join(dir, "blank")
	for p, body := range map[string]string{empty: "", blank: "  \n\t\n"} {
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return []struct {
		name, key, secret string
		sets              []string
	}{
		{"whsec not base64", "dispatch.webhook.secret", "sekrit", []string{"dispatch.webhook.secret=whsec_!!!sekrit"}},
		{"whsec no bytes", "dispatch.webhook.secret", "", []string{"dispatch.webhook.secret=whsec_"}},
		{"unparsable URL DSN", "postgres.dsn", "sekrit", []string{"postgres.dsn=postgres://a b:sekrit@127.0.0.1/db"}},
		{"unparsable key=value DSN", "postgres.dsn", "sekrit", []string{"postgres.dsn=host=127.0.0.1 password=pw sekrit"}},
		{"empty secret_file", "dispatch.webhook.secret_file", "", []string{"dispatch.webhook.secret_file=" + empty}},
		{"blank password_file", "redis.password_file", "", []string{"redis.password_file=" + blank}},
		{"empty dsn_file", "postgres.dsn_file", "", []string{"postgres.dsn_file=" + empty}},
		{"timeout above lock_ttl/2", "dispatch.webhook.timeout", "", []string{"poller.lock_ttl=2s", "dispatch.webhook.timeout=2s"}},
	}
}

// `config` and `run` both refuse, with exit 2 (systemd's
// RestartPreventExitStatus) naming the key and echoing no secret.
func TestBadSecretsExit2(t *testing.T) {
	t.Parallel()
	// Should a setting slip through, `run` must fail rather than serve
	// forever: an http.addr it cannot listen on (192.0.2.1 is TEST-NET-1,
	// no host's address) ends it with exit 1.
	// The database is this test's own, unless the DSN is what is tested.
	safe := []string{"--set", "postgres.dsn=" + testenv.DSN(t), "--set", "http.addr=192.0.2.1:1",
		"--set", "redis.addrs=" + testenv.RedisAddr(), "--set", "redis.key_prefix=" + testenv.Prefix(t)}
	for _, tc := range badSecrets(t) {
		for _, cmd := range []string{"config", "run"} {
			t.Run(tc.name+"/"+cmd, func(t *testing.T) {
				t.Parallel()
				args := append([]string{cmd}, safe...)
				for _, kv := range tc.sets {
					args = append(args, "--set", kv)
				}
				var out, errb bytes.Buffer
				code := run(args, &out, &errb)
				if code != 2 || !strings.Contains(errb.String(), tc.key) {
					t.Fatalf("exit %d stderr %q, want exit 2 naming %s", code, errb.String(), tc.key)
				}
				if tc.secret != "" && strings.Contains(out.String()+errb.String(), tc.secret) {
					t.Fatalf("output echoes the secret:\n%s%s", out.String(), errb.String())
				}
			})
		}
	}
}

// Against the real binary: `run` with an undecodable whsec_
// secret exits 2 at once.
func TestBinaryRefusesBadSecretWithExit2(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	for _, tc := range badSecrets(t)[:3] {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			args := []string{"run", "--set", "http.addr=192.0.2.1:1"}
			for _, kv := range tc.sets {
				args = append(args, "--set", kv)
			}
			cmd := exec.CommandContext(ctx, bin, args...)
			cmd.Env = append(os.Environ(), "OUTBOXD_POSTGRES_DSN="+testenv.DSN(t), "OUTBOXD_REDIS_ADDRS="+testenv.RedisAddr(),
				"OUTBOXD_REDIS_KEY_PREFIX="+testenv.Prefix(t))
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(stderr.String(), tc.key) {
				t.Fatalf("outboxd %s: %v, stderr %q; want exit 2 naming %s", strings.Join(args, " "), err, stderr.String(), tc.key)
			}
			if tc.secret != "" && strings.Contains(stderr.String(), tc.secret) {
				t.Fatalf("stderr echoes the secret: %s", stderr.String())
			}
		})
	}
}

// `outboxd config` shows every DSN spelling and the webhook URL
// with their secrets replaced, and the rest as written.
func TestConfigShowsNoSecrets(t *testing.T) {
	t.Parallel()
	url := "https://hook:pw-SECRET1@receiver.example/in?token=SECRET2&tenant=7"
	for _, tc := range []struct {
		dsn, want string
		secrets   []string
	}{
		{"host=127.0.0.1 user=postgres password = SECRET3 dbname=postgres", "password = redacted", []string{"SECRET3"}},
		{"host=127.0.0.1 user=postgres password='SEC RET4' dbname=postgres", "password=redacted", []string{"SEC RET4", "RET4"}},
		{"host=127.0.0.1 user=postgres sslpassword=SECRET5 dbname=postgres", "sslpassword=redacted", []string{"SECRET5"}},
		{"postgres://postgres:pa#SECRET6@127.0.0.1:5432/postgres", "postgres://postgres:redacted@127.0.0.1:5432/postgres", []string{"SECRET6"}},
	} {
		t.Run(tc.secrets[0], func(t *testing.T) {
			t.Parallel()
			var out, errb bytes.Buffer
			code := run([]string{"config", "--set", "postgres.dsn=" + tc.dsn, "--set", "dispatch.webhook.url=" + url}, &out, &errb)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errb.String())
			}
			all := out.String() + errb.String()
			for _, s := range append(tc.secrets, "SECRET1", "SECRET2") {
				if strings.Contains(all, s) {
					t.Errorf("output shows %q:\n%s", s, all)
				}
			}
			for _, want := range []string{tc.want, "https://hook:redacted@receiver.example/in?token=redacted&tenant=7"} {
				if !strings.Contains(all, want) {
					t.Errorf("output lacks %q:\n%s", want, all)
				}
			}
		})
	}
}

// `outboxd health` asks a real /readyz: 0 while Postgres and
// Redis answer, 1 naming redis once it is gone, 1 when nothing listens.
// Not parallel: it routes go-redis' process-wide logger (RouteRedisLogs),
// which every other test's Redis clients would write to.
func TestHealth(t *testing.T) {
	rs := testenv.StartRedisServer(t)
	port := strconv.Itoa(testenv.FreePort(t))
	cfg, err := app.LoadConfig("", []string{"postgres.dsn=" + testenv.DSN(t), "redis.addrs=" + rs.Addr,
		"http.addr=0.0.0.0:" + port, "dispatch.sink=noop"})
	if err != nil {
		t.Fatal(err)
	}
	quiet := app.NewLogger("error", "json", io.Discard)
	app.RouteRedisLogs(quiet) // go-redis' complaints once Redis is stopped
	a, err := app.New(context.Background(), cfg, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("app: %v", err)
		}
	}()

	// http.addr as the replica has it (wildcard host): health asks 127.0.0.1.
	health := []string{"health", "--set", "http.addr=0.0.0.0:" + port}
	code, stdout, stderr := waitForExit(t, health, 0)
	if !strings.Contains(stdout, "ready: http://127.0.0.1:"+port+"/readyz") {
		t.Fatalf("exit %d stdout %q stderr %q", code, stdout, stderr)
	}
	if code, _, stderr := runHealth([]string{"health", "--url", "http://127.0.0.1:" + port + "/readyz"}); code != 0 {
		t.Fatalf("--url: exit %d: %s", code, stderr)
	}

	rs.Stop()
	_, _, stderr = waitForExit(t, health, 1)
	if strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "answered 503: redis: ") || strings.Contains(stderr, "postgres:") {
		t.Fatalf("stderr %q: want one line naming redis (and not postgres)", stderr)
	}

	nobody := strconv.Itoa(testenv.FreePort(t))
	code, _, stderr = runHealth([]string{"health", "--set", "http.addr=127.0.0.1:" + nobody})
	if code != 1 || !strings.Contains(stderr, "not ready") || !strings.Contains(stderr, "127.0.0.1:"+nobody) {
		t.Fatalf("nothing listening: exit %d stderr %q, want 1 naming the address", code, stderr)
	}
	if code, _, stderr := runHealth([]string{"health", "--timeout", "0s"}); code != 2 {
		t.Fatalf("--timeout 0s: exit %d %q, want 2", code, stderr)
	}
}

func runHealth(args []string) (int, string, string) {
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

// waitForExit runs args until they exit with want (the app comes up, or
// notices Redis gone, on its own time), failing after 15s.
func waitForExit(t *testing.T, args []string, want int) (int, string, string) {
	t.Helper()
	var code int
	var stdout, stderr string
	testkit.WaitFor(t, 15*time.Second, fmt.Sprintf("%v to exit %d", args, want), func() bool {
		code, stdout, stderr = runHealth(args)
		return code == want
	}, func() string { return fmt.Sprintf("exit %d (stdout %q stderr %q)", code, stdout, stderr) })
	return code, stdout, stderr
}

// With Redis unreachable, the real binary keeps stdout one JSON object per
// line, reports the outage there, and writes nothing else to stderr.
func TestLogsStayJSONWhenRedisIsDown(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	down := testenv.StartRedisServer(t)
	down.Stop()
	cmd := exec.Command(bin, "run")
	cmd.Env = append(os.Environ(), "OUTBOXD_POSTGRES_DSN="+testenv.DSN(t), "OUTBOXD_REDIS_ADDRS="+down.Addr,
		"OUTBOXD_HTTP_ADDR=127.0.0.1:"+strconv.Itoa(testenv.FreePort(t)), "OUTBOXD_POLLER_LOCK_WAIT=200ms")
	var stdout, stderr testkit.Logs // exec copies into them from its own goroutines
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Several failed attempts: go-redis logs after repeated failed dials.
	if _, ok := stdout.Await(15*time.Second, 4, func(line string) bool {
		return strings.Contains(line, `"msg":"lock attempt failed"`)
	}); !ok {
		t.Logf("fewer than 4 failed lock attempts logged within 15s; checking what was logged")
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
