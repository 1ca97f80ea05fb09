package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// valid is a configuration every section of which passes Validate but
// dispatch (checked by the sink registry, not here).
func valid() Config {
	return Config{
		Postgres: Postgres{DSN: "postgres://postgres@127.0.0.1:5432/postgres", Schema: "public", Pooler: "none"},
		Redis:    Redis{Addrs: []string{"127.0.0.1:6379"}, Mode: "single"},
		Lock:     Lock{Backend: LockRedis},
		Poller: Poller{LockTTL: 30 * time.Second, LockWait: time.Second, PollInterval: time.Second, ClaimTTL: time.Minute,
			BackoffBase: time.Second, BackoffMax: time.Minute, GapWait: time.Second, BatchSize: 100, MaxAttempts: 5,
			Concurrency: 1, MaxPayloadBytes: 1 << 20, BatchMaxBytes: 1 << 20},
		Reconcile:       Reconcile{LockTTL: 300 * time.Second, Retention: time.Hour, BatchSize: 1000},
		HTTP:            HTTP{Addr: "127.0.0.1:9090", MaxConcurrent: 2},
		Log:             Log{Level: "info", Format: "json"},
		ShutdownTimeout: 25 * time.Second,
		InstanceID:      "replica-1",
		Dispatch:        Dispatch{Breaker: Breaker{Failures: 5, ProbeInterval: 5 * time.Second}},
	}
}

// wantKeyError fails unless err is a *KeyError naming key.
func wantKeyError(t *testing.T, what string, err error, key string) {
	t.Helper()
	var ke *KeyError
	if !errors.As(err, &ke) || ke.Key != key {
		t.Errorf("%s: %v, want a KeyError naming %s", what, err, key)
	}
}

// Values that parse but cannot work are refused naming their key: an
// http.addr whose port is out of range or that is empty (which would listen
// on a random port of every interface), leases shorter than their floors.
func TestValuesThatCannotWorkAreRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, key string
		set       func(*Config)
	}{
		{"port out of range", "http.addr", func(c *Config) { c.HTTP.Addr = "127.0.0.1:99999" }},
		{"empty address", "http.addr", func(c *Config) { c.HTTP.Addr = "" }},
		{"no port", "http.addr", func(c *Config) { c.HTTP.Addr = "127.0.0.1" }},
		{"named port", "http.addr", func(c *Config) { c.HTTP.Addr = "127.0.0.1:http" }},
		{"random port, every interface", "http.addr", func(c *Config) { c.HTTP.Addr = ":0" }},
		{"random port, IPv4 wildcard", "http.addr", func(c *Config) { c.HTTP.Addr = "0.0.0.0:0" }},
		{"random port, IPv6 wildcard", "http.addr", func(c *Config) { c.HTTP.Addr = "[::]:0" }},
		{"reconcile lease 1ms", "reconcile.lock_ttl", func(c *Config) { c.Reconcile.LockTTL = time.Millisecond }},
		{"reconcile lease 999ms", "reconcile.lock_ttl", func(c *Config) { c.Reconcile.LockTTL = 999 * time.Millisecond }},
		{"poller lease 299ms", "poller.lock_ttl", func(c *Config) { c.Poller.LockTTL = 299 * time.Millisecond }},
		{"no ops request at once", "http.max_concurrent", func(c *Config) { c.HTTP.MaxConcurrent = 0 }},
		{"65 ops requests at once", "http.max_concurrent", func(c *Config) { c.HTTP.MaxConcurrent = 65 }},
	} {
		c := valid()
		tc.set(&c)
		wantKeyError(t, tc.name, c.Validate(), tc.key)
	}
	for _, addr := range []string{"127.0.0.1:9090", "0.0.0.0:9090", ":9090", "[::1]:9090", "127.0.0.1:0", "localhost:65535"} {
		c := valid()
		c.HTTP.Addr = addr
		if err := c.Validate(); err != nil {
			t.Errorf("http.addr %q refused: %v", addr, err)
		}
	}
	c := valid()
	c.Reconcile.LockTTL, c.Poller.LockTTL = time.Second, 300*time.Millisecond
	if err := c.Validate(); err != nil {
		t.Errorf("the floors themselves refused: %v", err)
	}
}

// A *_file secret must be a regular file of at most SecretFileLimit bytes:
// a device is refused before it is read without end, a FIFO before it is
// opened (which would block the start until a writer comes), a directory,
// and a file past the limit. Each error names the key.
func TestSecretFilesMustBeSmallRegularFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, []byte(strings.Repeat("x", SecretFileLimit+1)), 0o600); err != nil {
		t.Fatal(err)
	}
	atLimit := filepath.Join(dir, "at-limit")
	if err := os.WriteFile(atLimit, []byte(strings.Repeat("y", SecretFileLimit)), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(atLimit, link); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path, want string
	}{
		{"/dev/zero", "character device"},
		{fifo, "FIFO"},
		{dir, "directory"},
		{big, "larger than the limit"},
	} {
		for _, sec := range secrets {
			if sec.file == "" {
				continue
			}
			var c Config
			*c.stringField(sec.file) = tc.path
			err := c.readSecretFiles(nil)
			wantKeyError(t, tc.path, err, sec.file)
			if err != nil && !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s=%s: %v, want it to say %q", sec.file, tc.path, err, tc.want)
			}
		}
	}
	for _, ok := range []string{atLimit, link} {
		var c Config
		c.Redis.PasswordFile = ok
		if err := c.readSecretFiles(nil); err != nil || len(c.Redis.Password) != SecretFileLimit {
			t.Errorf("%s: %v (read %d bytes), want the whole file", ok, err, len(c.Redis.Password))
		}
	}
}

// The TLS files are checked the same way (a CA bundle on a FIFO would hang
// the start when it is read).
func TestTLSFilesMustBeRegularFiles(t *testing.T) {
	t.Parallel()
	fifo := filepath.Join(t.TempDir(), "ca")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{fifo, "/dev/zero"} {
		err := CheckTLSFiles("redis.tls", TLS{Enabled: true, CAFile: path})
		wantKeyError(t, path, err, "redis.tls.ca_file")
	}
}

// --config keeps the file rule with LargeFileLimit, and so do the TLS
// files (checked before they are read): a device, a FIFO, a directory or
// a larger file is refused naming the flag or the key, before any value
// of the file is used.
func TestConfigAndTLSFilesKeepTheFileRule(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, []byte("#"+strings.Repeat("x", LargeFileLimit)), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/dev/zero", fifo, dir, big, filepath.Join(dir, "missing")} {
		_, err := Load(path, nil, fields)
		wantKeyError(t, "--config "+path, err, "--config")
		if err != nil && !strings.Contains(err.Error(), path) {
			t.Errorf("--config %s: %v, want the path named", path, err)
		}
		if path == filepath.Join(dir, "missing") {
			continue
		}
		err = CheckTLSFiles("redis.tls", TLS{Enabled: true, CertFile: path, KeyFile: path})
		wantKeyError(t, "cert_file "+path, err, "redis.tls.cert_file")
	}
	atLimit := filepath.Join(dir, "at-limit.yaml")
	if err := os.WriteFile(atLimit, []byte("#"+strings.Repeat("x", LargeFileLimit-2)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFile("--config", atLimit, LargeFileLimit); err != nil {
		t.Errorf("a file of exactly the limit: %v", err)
	}
}
