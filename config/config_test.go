package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/config"
)

func writeFile(t *testing.T, body string) string {
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDefaultsAreValid(t *testing.T) {
	c, err := config.Load("", nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Poller.LockTTL != 30*time.Second || c.Reconcile.LockTTL != 300*time.Second {
		t.Fatalf("lock TTLs %s / %s, want the contract's 30s / 300s", c.Poller.LockTTL, c.Reconcile.LockTTL)
	}
}

func TestRepositoryConfigYAMLLoads(t *testing.T) {
	c, err := config.Load("../config.yaml", nil)
	if err != nil {
		t.Fatalf("config.yaml at the repository root must run as-is: %v", err)
	}
	if c.Postgres.DSN == "" || len(c.Redis.Addrs) != 1 {
		t.Fatalf("unexpected %+v", c)
	}
}

func TestPrecedenceFileEnvFlag(t *testing.T) {
	file := writeFile(t, "poller:\n  batch_size: 100\n  poll_interval: 1s\nredis:\n  addrs: [\"10.0.0.1:6379\"]\n")
	t.Setenv("OUTBOXD_POLLER_BATCH_SIZE", "200")
	t.Setenv("OUTBOXD_REDIS_ADDRS", "127.0.0.1:7001, 127.0.0.1:7002,127.0.0.1:7003")
	t.Setenv("OUTBOXD_REDIS_MODE", "redlock")
	c, err := config.Load(file, []string{"poller.batch_size=300"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Poller.BatchSize != 300 {
		t.Fatalf("batch_size %d, want the flag's 300", c.Poller.BatchSize)
	}
	if c.Poller.PollInterval != time.Second {
		t.Fatalf("poll_interval %s, want the file's 1s", c.Poller.PollInterval)
	}
	want := []string{"127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"}
	if strings.Join(c.Redis.Addrs, ",") != strings.Join(want, ",") {
		t.Fatalf("addrs %q, want env's %q", c.Redis.Addrs, want)
	}
}

func TestErrorsNameTheKey(t *testing.T) {
	for _, tc := range []struct {
		name string
		file string
		env  map[string]string
		sets []string
		key  string
	}{
		{name: "bad duration", sets: []string{"poller.poll_interval=soon"}, key: "poller.poll_interval"},
		{name: "bad duration in file", file: "reconcile:\n  retention: forever\n", key: "reconcile.retention"},
		{name: "number as duration", file: "poller:\n  lock_ttl: 30\n", key: "poller.lock_ttl"},
		{name: "bad cron", sets: []string{"reconcile.schedule=every five minutes"}, key: "reconcile.schedule"},
		{name: "negative batch size", sets: []string{"poller.batch_size=-5"}, key: "poller.batch_size"},
		{name: "non-numeric batch size", env: map[string]string{"OUTBOXD_POLLER_BATCH_SIZE": "lots"}, key: "poller.batch_size"},
		{name: "unknown key in file", file: "poller:\n  batchsize: 5\n", key: "poller.batchsize"},
		{name: "unknown key in --set", sets: []string{"poller.nope=1"}, key: "poller.nope"},
		{name: "bad mode", sets: []string{"redis.mode=magic"}, key: "redis.mode"},
		{name: "redlock with one node", sets: []string{"redis.mode=redlock"}, key: "redis.mode"},
		{name: "bad url", sets: []string{"dispatch.webhook.url=ftp://x"}, key: "dispatch.webhook.url"},
		{name: "bad sink", sets: []string{"dispatch.sink=kafka"}, key: "dispatch.sink"},
		{name: "bad level", sets: []string{"log.level=loud"}, key: "log.level"},
		{name: "zero shutdown", sets: []string{"shutdown_timeout=0s"}, key: "shutdown_timeout"},
		{name: "bad bool", sets: []string{"poller.notify=maybe"}, key: "poller.notify"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			file := ""
			if tc.file != "" {
				file = writeFile(t, tc.file)
			}
			_, err := config.Load(file, tc.sets)
			var ke *config.KeyError
			if !errors.As(err, &ke) || ke.Key != tc.key || !strings.Contains(err.Error(), tc.key) {
				t.Fatalf("got %v, want a KeyError naming %s", err, tc.key)
			}
		})
	}
}

func TestRedactedHidesSecrets(t *testing.T) {
	c, err := config.Load("", []string{
		"postgres.dsn=postgres://app:pg-s3cret@db:5432/app",
		"redis.password=redis-s3cret",
		"dispatch.webhook.secret=whsec_s3cret",
	})
	if err != nil {
		t.Fatal(err)
	}
	out := strings.ToLower(strings.Join(flatten(c.Redacted()), " "))
	for _, s := range []string{"pg-s3cret", "redis-s3cret", "whsec_s3cret"} {
		if strings.Contains(out, s) {
			t.Fatalf("redacted config shows %q: %s", s, out)
		}
	}
	if !strings.Contains(out, "app@db") && !strings.Contains(out, "app:redacted@db") {
		t.Fatalf("DSN lost more than its password: %s", out)
	}
}

func flatten(m map[string]any) []string {
	var out []string
	for k, v := range m {
		if sub, ok := v.(map[string]any); ok {
			out = append(out, flatten(sub)...)
			continue
		}
		out = append(out, k+"="+strings.TrimSpace(strings.ReplaceAll(strings.ReplaceAll(toString(v), "\n", " "), "\t", " ")))
	}
	return out
}

func toString(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case []string:
		return strings.Join(x, ",")
	default:
		return ""
	}
}

func TestSecretFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	dsn := write("dsn", "postgres://app:pw@db:5432/app\n")
	secret := write("secret", "  s3cret\n")
	c, err := config.Load("", []string{"postgres.dsn_file=" + dsn, "dispatch.webhook.secret_file=" + secret})
	if err != nil {
		t.Fatal(err)
	}
	if c.Postgres.DSN != "postgres://app:pw@db:5432/app" || c.Dispatch.Webhook.Secret != "s3cret" {
		t.Fatalf("dsn %q secret %q: want the files' trimmed contents", c.Postgres.DSN, c.Dispatch.Webhook.Secret)
	}
	for _, tc := range []struct {
		sets []string
		key  string
	}{
		{[]string{"redis.password=x", "redis.password_file=" + secret}, "redis.password_file"},
		{[]string{"dispatch.webhook.secret_file=" + filepath.Join(dir, "missing")}, "dispatch.webhook.secret_file"},
		{[]string{"redis.tls.ca_file=" + secret}, "redis.tls.ca_file"},
		{[]string{"redis.tls.enabled=true", "redis.tls.ca_file=" + filepath.Join(dir, "missing")}, "redis.tls.ca_file"},
		{[]string{"redis.tls.enabled=true", "redis.tls.cert_file=" + secret}, "redis.tls.key_file"},
	} {
		_, err := config.Load("", tc.sets)
		var ke *config.KeyError
		if !errors.As(err, &ke) || ke.Key != tc.key {
			t.Errorf("%v: got %v, want a KeyError naming %s", tc.sets, err, tc.key)
		}
	}
}
