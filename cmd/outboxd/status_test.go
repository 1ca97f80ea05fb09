package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/internal/testenv"
)

// `outboxd status` names the backend that issues the tokens: with
// lock.backend postgres its table says "TOKEN ISSUED (postgres)", never
// Redis, and --json says lock_backend postgres.
func TestStatusNamesTheLeaseBackend(t *testing.T) {
	t.Parallel()
	_, dsn := testenv.Store(t)
	args := []string{"status", "--set", "lock.backend=postgres", "--set", "redis.addrs="}
	code, out, errb := cli(dsn, args...)
	if code != 0 {
		t.Fatalf("outboxd status with lock.backend postgres: exit %d, stderr %s", code, errb)
	}
	header, _, _ := strings.Cut(out, "\n")
	if !strings.Contains(header, "TOKEN ISSUED (postgres)") || strings.Contains(header, "redis") {
		t.Errorf("status' locks header %q, want TOKEN ISSUED (postgres) and no redis", header)
	}
	code, out, errb = cli(dsn, append(args, "--json")...)
	var st struct {
		LockBackend string `json:"lock_backend"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st.LockBackend != "postgres" {
		t.Errorf("outboxd status --json: exit %d, lock_backend %q in %s (stderr %s), want postgres", code, st.LockBackend, out, errb)
	}
}

// The locks table names whichever backend status reports.
func TestPrintLocksNamesTheBackend(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"redis", "postgres", "etcd"} {
		var b strings.Builder
		printLocks(&b, backend, nil)
		if !strings.Contains(b.String(), "TOKEN ISSUED ("+backend+")") {
			t.Errorf("locks table for %s: %q", backend, b.String())
		}
	}
}
