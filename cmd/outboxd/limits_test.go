package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testenv"
)

// Values that parse but cannot work make the built binary's `config` and
// `run` exit 2 naming the key (systemd's RestartPreventExitStatus), at
// once: a port out of range, an empty http.addr (a random port on every
// interface), leases and schedules below their floors, and secret files
// that are a device read without end or a FIFO that blocks the open.
// Everything else points at this test's own database and Redis prefix, so
// a value that slips through starts a relay, which the deadline ends: a
// failure.
func TestBinaryRefusesValuesThatCannotWork(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	fifo := filepath.Join(t.TempDir(), "dsn")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ key, value string }{
		{"http.addr", "127.0.0.1:99999"},
		{"http.addr", ""},
		{"reconcile.lock_ttl", "1ms"},
		{"reconcile.schedule", "@every 0s"},
		{"postgres.dsn_file", "/dev/zero"},
		{"postgres.dsn_file", fifo},
		{"dispatch.webhook.secret_file", fifo},
	} {
		for _, cmd := range []string{"config", "run"} {
			t.Run(cmd+" "+tc.key+"="+tc.value, func(t *testing.T) {
				t.Parallel()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				c := exec.CommandContext(ctx, bin, cmd, "--set", tc.key+"="+tc.value)
				c.Env = append(os.Environ(), "OUTBOXD_POSTGRES_DSN="+testenv.DSN(t), "OUTBOXD_REDIS_ADDRS="+testenv.RedisAddr(),
					"OUTBOXD_REDIS_KEY_PREFIX="+testenv.Prefix(t), "OUTBOXD_DISPATCH_SINK=noop")
				if tc.key != "http.addr" {
					c.Env = append(c.Env, "OUTBOXD_HTTP_ADDR=127.0.0.1:0")
				}
				var stderr bytes.Buffer
				c.Stderr = &stderr
				err := c.Run()
				var ee *exec.ExitError
				if ctx.Err() != nil || !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(stderr.String(), tc.key) {
					t.Fatalf("outboxd %s --set %s=%s: %v (deadline: %v), stderr %q; want exit 2 naming %s",
						cmd, tc.key, tc.value, err, ctx.Err(), stderr.String(), tc.key)
				}
			})
		}
	}
}
