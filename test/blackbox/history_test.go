package blackbox

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testkit"
)

// Attempt history: each failed attempt of a row is recorded (time, kind,
// the start of the failure's text, the send's duration, the fencing token),
// the last 10 kept; `dead show --json` has them as the list history, the
// table prints them; a purge of the dead row takes them with it.
func TestAttemptHistoryKeepsTheLastFailuresAndGoesWithTheRow(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rc := newRecorder(t, func(testkit.Request) testkit.Reply {
		return testkit.Reply{Status: http.StatusServiceUnavailable}
	})
	e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", rc.URL(), "OUTBOXD_POLLER_MAX_ATTEMPTS", "12",
		"OUTBOXD_DISPATCH_BREAKER_FAILURES", "0", // every attempt goes to the receiver
		"OUTBOXD_RECONCILE_RETENTION", "1h", "OUTBOXD_RECONCILE_DEAD_RETENTION", "1h")
	id := e.insert("hist", "1", `{"n":1}`, "")
	e.start()
	waitFor(t, "the row dead-lettered after 12 attempts", func() bool { return e.row(id).Dead }, e.describeRows("true"))

	res := runBinary(t, e.vars, exitLimit, "dead", "show", "--json", strconv.FormatInt(id, 10))
	var shown struct {
		ID      int64 `json:"id"`
		History []struct {
			Attempt      int       `json:"attempt"`
			At           time.Time `json:"at"`
			Kind         string    `json:"kind"`
			Excerpt      string    `json:"excerpt"`
			DurationMS   *int64    `json:"duration_ms"`
			FencingToken int64     `json:"fencing_token"`
		} `json:"history"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &shown); err != nil || shown.ID != id {
		t.Fatalf("dead show --json: %v: %s", err, res)
	}
	if len(shown.History) != 10 {
		t.Fatalf("history has %d entries, want the last 10 of 12: %s", len(shown.History), res.stdout)
	}
	for i, a := range shown.History {
		if a.Attempt != 3+i || a.Kind != "http_503" || !strings.Contains(a.Excerpt, "503") ||
			a.DurationMS == nil || *a.DurationMS < 0 || a.FencingToken < 1 || a.At.IsZero() ||
			i > 0 && a.At.Before(shown.History[i-1].At) {
			t.Errorf("history[%d] = %+v, want attempt %d, kind http_503, an excerpt naming 503, a duration, a token, in time order", i, a, 3+i)
		}
	}
	if res := runBinary(t, e.vars, exitLimit, "dead", "show", strconv.FormatInt(id, 10)); !strings.Contains(res.stdout, "history") ||
		!strings.Contains(res.stdout, "http_503") {
		t.Errorf("dead show (table) does not print the history: %s", res)
	}

	history := func() int {
		var n int
		if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_attempts WHERE outbox_id = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// Dead for longer than reconcile.dead_retention.
	if _, err := e.pool.Exec(context.Background(), `UPDATE outbox SET dead_at = now() - interval '2 hours' WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if res := runBinary(t, e.vars, exitLimit, "reconcile", "--once"); res.code != 0 {
		t.Fatalf("reconcile --once: %s", res)
	}
	if n := e.count("id = $1", id); n != 0 {
		t.Fatalf("the dead row was not purged")
	}
	if n := history(); n != 0 {
		t.Errorf("%d history entries outlived their purged row", n)
	}
}

// A row's own 4xx (422) dead-letters it at once, and its history holds
// that attempt: the status as its kind, the receiver's answer in the
// excerpt, the token that sent it.
func TestAttemptHistoryRecordsARowsOwnRefusal(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rc := newRecorder(t, func(testkit.Request) testkit.Reply {
		return testkit.Reply{Status: http.StatusUnprocessableEntity}
	})
	e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", rc.URL())
	id := e.insert("hist422", "1", `{"n":1}`, "")
	e.start()
	waitFor(t, "the row dead-lettered on its 422", func() bool { return e.row(id).Dead }, e.describeRows("true"))

	res := runBinary(t, e.vars, exitLimit, "dead", "show", "--json", strconv.FormatInt(id, 10))
	var shown struct {
		ID      int64 `json:"id"`
		History []struct {
			Attempt      int    `json:"attempt"`
			Kind         string `json:"kind"`
			Excerpt      string `json:"excerpt"`
			FencingToken int64  `json:"fencing_token"`
		} `json:"history"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &shown); err != nil || shown.ID != id {
		t.Fatalf("dead show --json: %v: %s", err, res)
	}
	if len(shown.History) != 1 {
		t.Fatalf("history has %d entries, want the one failed attempt: %s", len(shown.History), res.stdout)
	}
	if a := shown.History[0]; a.Attempt != 1 || a.Kind != "http_422" || !strings.Contains(a.Excerpt, "422") || a.FencingToken < 1 {
		t.Errorf("history[0] = %+v, want attempt 1, kind http_422, an excerpt naming 422, a token", a)
	}
}
