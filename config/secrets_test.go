package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Every row of the table secrets names string keys that exist, so loading,
// redaction and SourceKey cover what it lists.
func TestSecretsTableNamesStringKeys(t *testing.T) {
	t.Parallel()
	for _, sec := range secrets {
		for _, k := range []string{sec.key, sec.file} {
			if k == "" {
				continue
			}
			if _, ok := fields[k].(string); !ok {
				t.Errorf("secrets: %q is not a string key of Config", k)
			}
		}
	}
}

// SourceKey names the *_file key of every secret read from a file, the
// Kafka SASL password included.
func TestSourceKeyNamesTheFile(t *testing.T) {
	t.Parallel()
	var c Config
	for _, sec := range secrets {
		if sec.file == "" {
			continue
		}
		if got := c.SourceKey(sec.key); got != sec.key {
			t.Errorf("SourceKey(%q) without a file = %q", sec.key, got)
		}
		*c.stringField(sec.file) = "/run/secrets/x"
		if got := c.SourceKey(sec.key); got != sec.file {
			t.Errorf("SourceKey(%q) with %s set = %q, want %q", sec.key, sec.file, got, sec.file)
		}
	}
	if got := c.SourceKey("dispatch.kafka.sasl.password"); got != "dispatch.kafka.sasl.password_file" {
		t.Errorf("SourceKey(dispatch.kafka.sasl.password) = %q", got)
	}
}

// A secret read from a file is redacted like one set directly, and the
// section not used is not read.
func TestSecretFilesAreReadAndRedacted(t *testing.T) {
	t.Parallel()
	f := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(f, []byte("hunter2-canary\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var c Config
	c.Dispatch.Kafka.SASL.PasswordFile = f
	c.Redis.PasswordFile = "/nonexistent"
	if err := c.readSecretFiles([]Section{DispatchSection}); err != nil {
		t.Fatal(err)
	}
	if c.Dispatch.Kafka.SASL.Password != "hunter2-canary" {
		t.Fatalf("password %q", c.Dispatch.Kafka.SASL.Password)
	}
	shown := c.Redacted()["dispatch"].(map[string]any)["kafka"].(map[string]any)["sasl"].(map[string]any)["password"]
	if s, _ := shown.(string); strings.Contains(s, "canary") || s == "" {
		t.Fatalf("shown as %q", shown)
	}
	if err := c.readSecretFiles([]Section{RedisSection}); err == nil || !strings.Contains(err.Error(), "redis.password_file") {
		t.Fatalf("redis section: %v, want the missing redis.password_file named", err)
	}
}
