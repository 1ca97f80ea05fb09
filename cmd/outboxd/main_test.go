package main

import (
	"bytes"
	"strings"
	"testing"
)

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
