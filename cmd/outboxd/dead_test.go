package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/outboxd/outboxd/internal/keys"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/lock"
	"github.com/outboxd/outboxd/lock/redislease"
	"github.com/outboxd/outboxd/store"
)

// deadDB is a fresh database with 12 dead rows (ids 1..12, dead_at one
// minute apart, newest last), one pending and one delivered row.
func deadDB(t *testing.T) (dsn string, st *store.Store) {
	t.Helper()
	st, dsn = testenv.Store(t)
	_, err := st.Pool().Exec(context.Background(), `
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers, attempts, last_error, dead_at)
SELECT 'deal', (g % 2)::text, CASE WHEN g % 3 = 0 THEN 'deal.funded' ELSE 'deal.closed' END,
  jsonb_build_object('n', g), '{"traceparent":"00-t"}', 25,
  CASE WHEN g % 2 = 0 THEN E'receiver answered 503\tSlow Down' ELSE 'Verbindung abgelehnt ✗' END,
  timestamptz '2026-11-20T12:00:00Z' + g * interval '1 minute'
FROM generate_series(1, 12) g;
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('deal', '1', 'deal.funded', '{}');
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, dispatched_at) VALUES ('deal', '1', 'deal.funded', '{}', now())`)
	if err != nil {
		t.Fatal(err)
	}
	return dsn, st
}

// cli runs outboxd in-process with args plus --set postgres.dsn=dsn.
func cli(dsn string, args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = run(append(args, "--set", "postgres.dsn="+dsn), &out, &errb)
	return code, out.String(), errb.String()
}

// withRedis adds the test Redis and a key prefix to args: a replay holds
// lock:reconciliation.
func withRedis(prefix string, args ...string) []string {
	return append(args, "--set", "redis.addrs="+testenv.RedisAddr(), "--set", "redis.key_prefix="+prefix)
}

func TestDeadListPagesAndFilters(t *testing.T) {
	t.Parallel()
	dsn, _ := deadDB(t)

	// The table: newest first, the error clipped to one line, a cursor.
	code, out, errs := cli(dsn, "dead", "list", "--limit", "5")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) < 7 || !strings.HasPrefix(lines[0], "ID") || !strings.HasPrefix(lines[1], "12 ") ||
		!strings.HasPrefix(lines[5], "8 ") || !strings.Contains(lines[1], "receiver answered 503 Slow Down") {
		t.Fatalf("dead list: exit %d\n%s\nstderr %s", code, out, errs)
	}
	after, ok := strings.CutPrefix(lines[len(lines)-1], "more: the same command with --after ")
	if !ok {
		t.Fatalf("no cursor line in\n%s", out)
	}
	code, out, _ = cli(dsn, "dead", "list", "--limit", "5", "--after", after)
	if code != 0 || !strings.Contains(out, "\n7 ") || strings.Contains(out, "\n8 ") {
		t.Errorf("second page: exit %d\n%s", code, out)
	}

	// JSON pages walk the filtered list exactly once.
	var ids []int64
	args := []string{"dead", "list", "--json", "--limit", "2", "--aggregate", "deal/0", "--error", "SLOW down",
		"--since", "2026-11-20T12:03:00Z", "--until", "2026-11-20T12:11:00Z"}
	for pages := 0; pages < 10; pages++ {
		code, out, errs := cli(dsn, args...)
		var page store.DeadPage
		if err := json.Unmarshal([]byte(out), &page); code != 0 || err != nil {
			t.Fatalf("%v: exit %d %v\n%s\n%s", args, code, err, out, errs)
		}
		for _, e := range page.Events {
			ids = append(ids, e.ID)
		}
		if page.Next == "" {
			break
		}
		args = append(args, "--after", page.Next) // a later --after wins
	}
	if want := []int64{10, 8, 6, 4}; !slices.Equal(ids, want) {
		t.Errorf("filtered walk: %v, want %v", ids, want)
	}

	code, out, _ = cli(dsn, "dead", "list", "--event-type", "no.such.*")
	if code != 0 || strings.TrimSpace(out) != "no dead-lettered events" {
		t.Errorf("empty list: exit %d %q", code, out)
	}
}

func TestDeadShow(t *testing.T) {
	t.Parallel()
	dsn, _ := deadDB(t)
	code, out, errs := cli(dsn, "dead", "show", "3")
	for _, want := range []string{"id:", "deal/1", "deal.funded", "attempts:      25", "dead at:       2026-11-20T12:03:00Z",
		"Verbindung abgelehnt ✗", `"traceparent": "00-t"`, `"n": 3`, "created at:", "available at:"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("dead show 3: exit %d, %q missing from\n%s%s", code, want, out, errs)
		}
	}
	code, out, _ = cli(dsn, "dead", "show", "--json", "4")
	var e store.DeadEvent
	if err := json.Unmarshal([]byte(out), &e); code != 0 || err != nil || e.ID != 4 || e.LastError != "receiver answered 503\tSlow Down" ||
		!strings.Contains(string(e.Payload), `"n": 4`) || !e.DeadAt.Valid {
		t.Errorf("dead show --json 4: exit %d %v\n%s", code, err, out)
	}
	for _, tc := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"dead", "show", "13"}, 1, "pending"},
		{[]string{"dead", "show", "14"}, 1, "delivered"},
		{[]string{"dead", "show", "99"}, 1, "no such outbox row"},
		{[]string{"dead", "show", "x"}, 2, "outbox id"},
		{[]string{"dead", "show"}, 2, "one outbox id"},
		{[]string{"dead", "show", "1", "2"}, 2, "one outbox id"},
	} {
		code, _, errs := cli(dsn, tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.says) {
			t.Errorf("%v: exit %d %q, want %d saying %q", tc.args, code, errs, tc.code, tc.says)
		}
	}
}

// A dry run counts what the replay then requeues; neither touches another row.
func TestReplayDryRunAndFilters(t *testing.T) {
	t.Parallel()
	dsn, st := deadDB(t)
	deadIDs := func() []int64 {
		rows, _ := st.Pool().Query(context.Background(), `SELECT id FROM outbox WHERE dead_at IS NOT NULL ORDER BY id`)
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	filter := []string{"--event-type", "deal.c*", "--aggregate", "deal", "--error", "abgelehnt", "--until", "2026-11-20T12:09:00Z"}
	code, out, errs := cli(dsn, append([]string{"replay", "--dead", "--dry-run"}, filter...)...)
	// deal.closed (g not a multiple of 3), odd g (the German error), dead before 12:09: 1, 5, 7.
	if code != 0 || strings.TrimSpace(out) != "would requeue 3 dead-lettered events (dry run: nothing changed)" {
		t.Fatalf("dry run: exit %d %q %s", code, out, errs)
	}
	if got := deadIDs(); len(got) != 12 {
		t.Fatalf("the dry run changed rows: %d dead, want 12", len(got))
	}
	if code, _, errs := cli(dsn, withRedis(testenv.Prefix(t), append([]string{"replay", "--dead"}, filter...)...)...); code != 0 {
		t.Fatalf("replay: exit %d %s", code, errs)
	}
	if got, want := deadIDs(), []int64{2, 3, 4, 6, 8, 9, 10, 11, 12}; !slices.Equal(got, want) {
		t.Errorf("dead after the replay: %v, want %v", got, want)
	}
	code, out, _ = cli(dsn, append([]string{"replay", "--dead", "--dry-run", "--id", "2,3,7"}, "--error", "503")...)
	if code != 0 || !strings.Contains(out, "would requeue 1 ") {
		t.Errorf("dry run with ids: exit %d %q", code, out)
	}
}

// An event-type glob's other characters are literal, LIKE's own (_ and %)
// included: deal_* lists and replays the row of type deal_funded, not the
// deal.funded and deal.closed rows a LIKE '_' would also match.
func TestDeadFiltersTakeLikeCharactersLiterally(t *testing.T) {
	t.Parallel()
	dsn, st := deadDB(t)
	if _, err := st.Pool().Exec(context.Background(), `
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, attempts, last_error, dead_at)
VALUES ('deal', '7', 'deal_funded', '{}', 25, 'refused', timestamptz '2026-11-20T13:00:00Z')`); err != nil {
		t.Fatal(err)
	}
	code, out, errs := cli(dsn, "dead", "list", "--event-type", "deal_*")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 2 || !strings.HasPrefix(lines[1], "15 ") {
		t.Errorf("dead list --event-type deal_*: exit %d, want only row 15 (deal_funded):\n%s%s", code, out, errs)
	}
	code, out, _ = cli(dsn, "dead", "list", "--event-type", "deal%*")
	if code != 0 || strings.TrimSpace(out) != "no dead-lettered events" {
		t.Errorf("dead list --event-type deal%%*: exit %d, want no rows:\n%s", code, out)
	}
	code, out, errs = cli(dsn, "replay", "--dead", "--dry-run", "--event-type", "deal_*")
	if code != 0 || strings.TrimSpace(out) != "would requeue 1 dead-lettered events (dry run: nothing changed)" {
		t.Errorf("replay --dry-run --event-type deal_*: exit %d %q %s, want 1 (row 15)", code, out, errs)
	}
}

func TestDeadUsageErrorsExit2NamingTheFlag(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"dead"}, "list, show or discard"},
		{[]string{"dead", "lsit"}, "lsit"},
		{[]string{"dead", "list", "--limit", "0"}, "--limit"},
		{[]string{"dead", "list", "--limit", "5000"}, "--limit"},
		{[]string{"dead", "list", "--since", "last tuesday"}, "--since"},
		{[]string{"dead", "list", "--until", "-1h"}, "--until"},
		{[]string{"dead", "list", "--since", "1h", "--until", "2h"}, "--since"},
		{[]string{"dead", "list", "--after", "page-2"}, "--after"},
		{[]string{"dead", "list", "--aggregate", "/1"}, "--aggregate"},
		{[]string{"dead", "list", "--error", ""}, "--error"},
		{[]string{"dead", "list", "--event-type", "a\x00"}, "--event-type"},
		{[]string{"dead", "list", "stray"}, "no arguments"},
		{[]string{"replay", "--dead", "--since", "soon"}, "--since"},
		{[]string{"replay", "--dead", "--limit", "5"}, "limit"}, // replay does not page
	} {
		var out, errb bytes.Buffer
		// No database is reached: the flags are checked first.
		code := run(append(tc.args, "--set", "postgres.dsn=postgres://nobody@127.0.0.1:1/none"), &out, &errb)
		if code != 2 || !strings.Contains(errb.String(), tc.says) {
			t.Errorf("%q: exit %d %q, want 2 naming %q", tc.args, code, errb.String(), tc.says)
		}
	}
}

// The built binary: exit codes as the reference gives them.
func TestDeadBinaryExitCodes(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	dsn, _ := deadDB(t)
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"dead", "list", "--json"}, 0},
		{[]string{"dead", "show", "1"}, 0},
		{[]string{"dead", "show", "13"}, 1},
		{[]string{"dead", "list", "--limit", "x"}, 2},
	} {
		cmd := exec.Command(bin, append(tc.args, "--set", "postgres.dsn="+dsn)...)
		out, err := cmd.Output()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != tc.code {
			t.Errorf("outboxd %v: exit %d, want %d\n%s", tc.args, code, tc.code, out)
		}
	}
}

// A replay waits for lock:reconciliation while a reconciliation holds it:
// past --lock-wait it fails naming the lock and its holder and requeues
// nothing; once the holder releases, it takes the lock with a higher token
// (its writes are fenced) and requeues. A dry run takes no lock.
func TestReplayWaitsForTheReconciliationLock(t *testing.T) {
	t.Parallel()
	dsn, st := deadDB(t)
	rdb, prefix := testenv.Redis(t)
	ctx := context.Background()
	locks := redislease.New([]redis.UniversalClient{rdb}, redislease.WithKeyPrefix(prefix))
	held, err := locks.Acquire(ctx, keys.ReconcileLock, lock.Options{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	holder := store.Fence{Lock: keys.ReconcileLock, Token: held.Token(), Owner: held.Owner()}
	if err := st.ClaimFence(ctx, holder); err != nil {
		t.Fatal(err)
	}
	dead := func() int64 {
		n, err := st.Ops().CountDead(ctx, store.DeadFilter{})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	code, _, errs := cli(dsn, withRedis(prefix, "replay", "--dead", "--lock-wait", "300ms")...)
	if code != 1 || !strings.Contains(errs, "lock:reconciliation is held by owner "+held.Owner()) ||
		!strings.Contains(errs, "nothing was requeued") || !strings.Contains(errs, "--lock-wait") {
		t.Fatalf("replay while the lock is held: exit %d, stderr %q; want 1 naming the lock, its holder and --lock-wait", code, errs)
	}
	if n := dead(); n != 12 {
		t.Fatalf("%d dead after a replay that did not get the lock, want 12", n)
	}
	if code, out, errs := cli(dsn, withRedis(prefix, "replay", "--dead", "--dry-run")...); code != 0 || !strings.Contains(out, "would requeue 12 ") {
		t.Fatalf("dry run while the lock is held: exit %d %q %s", code, out, errs)
	}

	type result struct {
		code      int
		out, errs string
	}
	done := make(chan result, 1)
	go func() {
		code, out, errs := cli(dsn, withRedis(prefix, "replay", "--dead", "--lock-wait", "1m")...)
		done <- result{code, out, errs}
	}()
	// Not a timing threshold: released early or late, the replay must end
	// up holding a later term than the holder's and requeue everything.
	time.Sleep(300 * time.Millisecond)
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.code != 0 {
		t.Fatalf("replay after the holder released: exit %d, stderr %q", r.code, r.errs)
	}
	if n := dead(); n != 0 {
		t.Errorf("%d dead after the replay, want 0", n)
	}
	if tok, _ := st.FenceToken(ctx, keys.ReconcileLock); tok <= holder.Token {
		t.Errorf("fence token %d after the replay, want above the holder's %d: the replay wrote under its own term", tok, holder.Token)
	}
	if !strings.Contains(r.out, `"msg":"lock acquired"`) || !strings.Contains(r.out, `"msg":"replay finished"`) {
		t.Errorf("replay log lacks lock acquired / replay finished:\n%s", r.out)
	}
}
