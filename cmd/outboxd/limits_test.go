package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/dispatch/webhook"
	"github.com/outboxd/outboxd/internal/testenv"
)

// Values that parse but cannot work make the built binary's `config` and
// `run` exit 2 naming the key (systemd's RestartPreventExitStatus), at
// once: a port out of range, an empty http.addr (a random port on every
// interface), leases and schedules below their floors, and files (every
// *_file key and --config) that are a device read without end, a FIFO
// that blocks the open, a directory, or larger than their bound; a headers
// file with more headers than the webhook takes. Everything else points at
// this test's own database and Redis prefix, so a value that slips through
// starts a relay, which the deadline ends: a failure.
func TestBinaryRefusesValuesThatCannotWork(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	dir := t.TempDir()
	fifo := filepath.Join(dir, "dsn")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	file := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	bigHeaders := file("big-headers", "X-A: 1\n"+strings.Repeat("# short lines\n", config.SecretFileLimit/14+1))
	var many strings.Builder
	for i := range webhook.MaxStaticHeaders + 1 {
		fmt.Fprintf(&many, "X-H%d: v\n", i)
	}
	manyHeaders := file("many-headers", many.String())
	longHeader := file("long-header", "X-Long: "+strings.Repeat("x", webhook.MaxStaticHeaderBytes)+"\n")
	bigConfig := file("big.yaml", "log:\n  level: info\n#"+strings.Repeat("x", config.LargeFileLimit)+"\n")
	set := func(kv string) []string { return []string{"--set", kv} }
	withWebhook := func(kv string) []string { return []string{"--set", "dispatch.sink=webhook", "--set", kv} }
	for _, tc := range []struct {
		key  string
		args []string
	}{
		{"http.addr", set("http.addr=127.0.0.1:99999")},
		{"http.addr", set("http.addr=")},
		{"reconcile.lock_ttl", set("reconcile.lock_ttl=1ms")},
		{"reconcile.schedule", set("reconcile.schedule=@every 0s")},
		{"postgres.dsn_file", set("postgres.dsn_file=/dev/zero")},
		{"postgres.dsn_file", set("postgres.dsn_file=" + fifo)},
		{"dispatch.webhook.secret_file", set("dispatch.webhook.secret_file=" + fifo)},
		{"dispatch.webhook.headers_file", withWebhook("dispatch.webhook.headers_file=/dev/zero")},
		{"dispatch.webhook.headers_file", withWebhook("dispatch.webhook.headers_file=" + fifo)},
		{"dispatch.webhook.headers_file", withWebhook("dispatch.webhook.headers_file=" + dir)},
		{"dispatch.webhook.headers_file", withWebhook("dispatch.webhook.headers_file=" + bigHeaders)},
		{"dispatch.webhook.headers_file", withWebhook("dispatch.webhook.headers_file=" + manyHeaders)},
		{"dispatch.webhook.headers_file", withWebhook("dispatch.webhook.headers_file=" + longHeader)},
		{"--config", []string{"--config", "/dev/zero"}},
		{"--config", []string{"--config", fifo}},
		{"--config", []string{"--config", dir}},
		{"--config", []string{"--config", bigConfig}},
		{"--config", []string{"--config", filepath.Join(dir, "missing.yaml")}},
	} {
		for _, cmd := range []string{"config", "run"} {
			t.Run(cmd+" "+strings.Join(tc.args, " "), func(t *testing.T) {
				t.Parallel()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				c := exec.CommandContext(ctx, bin, append([]string{cmd}, tc.args...)...)
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
					t.Fatalf("outboxd %s %s: %v (deadline: %v), stderr %q; want exit 2 naming %s",
						cmd, strings.Join(tc.args, " "), err, ctx.Err(), stderr.String(), tc.key)
				}
			})
		}
	}
}

// An environment variable set to "" sets its key to the empty value, as
// --set key= does: OUTBOXD_HTTP_ADDR= is refused naming http.addr (it was
// once left at its default without a word).
func TestBinaryRefusesAnEmptyVariableOfAKeyThatCannotBeEmpty(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	for _, kv := range []string{"OUTBOXD_HTTP_ADDR=", "OUTBOXD_POSTGRES_DSN=", "OUTBOXD_INSTANCE_ID="} {
		t.Run(kv, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c := exec.CommandContext(ctx, bin, "config")
			c.Env = append(os.Environ(), "OUTBOXD_DISPATCH_SINK=noop", kv)
			var stderr bytes.Buffer
			c.Stderr = &stderr
			err := c.Run()
			key := map[string]string{"OUTBOXD_HTTP_ADDR=": "http.addr", "OUTBOXD_POSTGRES_DSN=": "postgres.dsn", "OUTBOXD_INSTANCE_ID=": "instance_id"}[kv]
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(stderr.String(), key) {
				t.Fatalf("%s outboxd config: %v, stderr %q; want exit 2 naming %s", kv, err, stderr.String(), key)
			}
		})
	}
}
