package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/internal/testkit"
)

// A command other than `run` stops on SIGHUP as on SIGTERM (a closed
// terminal): `reconcile --once`, waiting for a lock held elsewhere, returns
// through its own shutdown (exit 1, the wait cancelled) instead of being
// ended by the signal.
func TestHangupStopsAWaitingCommandCleanly(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	rdb, prefix := testenv.Redis(t)
	ctx := context.Background()
	if err := rdb.Set(ctx, prefix+"lock:reconciliation", "someone", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	c := exec.Command(bin, "reconcile", "--once")
	c.Env = append(os.Environ(), "OUTBOXD_POSTGRES_DSN="+testenv.DSN(t), "OUTBOXD_REDIS_ADDRS="+testenv.RedisAddr(),
		"OUTBOXD_REDIS_KEY_PREFIX="+prefix, "OUTBOXD_POLLER_LOCK_WAIT=5m")
	var stderr bytes.Buffer
	c.Stderr = &stderr
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- c.Wait() }()
	// Waiting for the lock, it listens for its release: the signal
	// handling is in place by then.
	channel := prefix + "lock:reconciliation:released"
	testkit.WaitFor(t, 30*time.Second, "reconcile --once waiting for the lock", func() bool {
		return rdb.PubSubNumSub(ctx, channel).Val()[channel] > 0
	}, func() string { return stderr.String() })
	_ = c.Process.Signal(syscall.SIGHUP)
	var err error
	select {
	case err = <-exited:
	case <-time.After(30 * time.Second):
		_ = c.Process.Kill()
		t.Fatalf("reconcile --once still waiting 30s after SIGHUP; stderr %q", stderr.String())
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("reconcile --once after SIGHUP: %v, stderr %q; want exit 1 (its wait cancelled), not the signal's end", err, stderr.String())
	}
}
