package main

import (
	"bytes"
	"strings"
	"testing"
)

// A schedule that names a time zone and nothing else, which robfig/cron
// cannot parse without panicking, exits 2 naming the key.
func TestScheduleWithOnlyAZoneExits2(t *testing.T) {
	t.Parallel()
	for _, spec := range []string{"CRON_TZ=UTC", "TZ=0", "CRON_TZ=UTC ", "TZ=UTC\t*/5 * * * *x"} {
		for _, cmd := range []string{"config", "run"} {
			var out, errb bytes.Buffer
			code := run([]string{cmd, "--set", "reconcile.schedule=" + spec, "--set", "http.addr=127.0.0.1:0"}, &out, &errb)
			if code != 2 || !strings.Contains(errb.String(), "reconcile.schedule") {
				t.Errorf("outboxd %s with schedule %q: exit %d, stderr %q; want exit 2 naming reconcile.schedule", cmd, spec, code, errb.String())
			}
		}
	}
}

// Setting only poller.lock_ttl never makes a command exit about
// dispatch.webhook.timeout, a key the operator did not set. The default follows
// the lease, and migrate and status do not check sink settings at all: with
// an unreachable Postgres they fail at run time (exit 1), not on the config.
func TestLockTTLAloneIsAValidConfig(t *testing.T) {
	t.Parallel()
	var out, errb bytes.Buffer
	if code := run([]string{"config", "--set", "poller.lock_ttl=3s"}, &out, &errb); code != 0 {
		t.Fatalf("outboxd config with poller.lock_ttl=3s: exit %d, stderr %q", code, errb.String())
	}
	if !strings.Contains(out.String(), "timeout: 1.5s") {
		t.Errorf("outboxd config shows no effective webhook timeout of 1.5s:\n%s", out.String())
	}
	unreachable := "postgres.dsn=postgres://outboxd@127.0.0.1:1/outboxd?sslmode=disable&connect_timeout=2"
	for _, sets := range [][]string{
		{"poller.lock_ttl=3s"},
		{"poller.lock_ttl=3s", "dispatch.webhook.timeout=10s"}, // set and impossible, but not used
		{"dispatch.sink=kafka"},                                // no brokers
	} {
		for _, cmd := range []string{"migrate", "status"} {
			args := []string{cmd, "--set", unreachable}
			for _, s := range sets {
				args = append(args, "--set", s)
			}
			var out, errb bytes.Buffer
			if code := run(args, &out, &errb); code != 1 || strings.Contains(errb.String(), "dispatch.") {
				t.Errorf("outboxd %s %v: exit %d, stderr %q; want exit 1 (Postgres unreachable), nothing about dispatch.*", cmd, sets, code, errb.String())
			}
		}
	}
}
