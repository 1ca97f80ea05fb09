package blackbox

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testkit"
)

// adminToken is the named token the admin tests' relays accept.
const adminToken = "oncall-t0ken"

// withAdminToken writes an http.auth_tokens_file naming adminToken
// "oncall" and sets it on e; it returns the file of the bare token, for
// --token-file.
func withAdminToken(t *testing.T, e *testBundle) string {
	t.Helper()
	dir := t.TempDir()
	tokens, bare := filepath.Join(dir, "tokens"), filepath.Join(dir, "token")
	if err := os.WriteFile(tokens, []byte("# name:token\noncall:"+adminToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bare, []byte(adminToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.set("OUTBOXD_HTTP_AUTH_TOKENS_FILE", tokens)
	return bare
}

// post sends body to path on the replica's ops port with an Authorization
// header ("" sends none): status and body.
func (r *replica) post(path, authorization, body string) (int, string) {
	req, err := http.NewRequest(http.MethodPost, "http://"+r.addr+path, strings.NewReader(body))
	if err != nil {
		r.t.Fatal(err)
	}
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	resp, err := (&http.Client{Timeout: 60 * time.Second}).Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return resp.StatusCode, b.String()
}

// `outboxd resend` (here --via the admin API) re-delivers a chosen
// aggregate's delivered events, in order, as new rows marked with
// Outbox-Resent-From: behind the aggregate's event that was pending when
// it ran, and ahead of the one written after it; --dry-run counts and
// changes nothing; no filter needs --all (exit 2 naming it).
func TestResendRedeliversAnAggregateInOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rc := newRecorder(t, nil)
	tokenFile := withAdminToken(t, e)
	e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", rc.URL())
	rep := e.start()
	var first []int64
	for i := range 3 {
		first = append(first, e.insert("deal", "7", `{"n":`+strconv.Itoa(i)+`}`, ""))
	}
	other := e.insert("deal", "8", `{"n":9}`, "")
	rc.WaitDelivered(t, 30*time.Second, 4)

	res := runBinary(t, e.vars, 30*time.Second, "resend", "--aggregate", "deal/7", "--dry-run")
	if res.code != 0 || !strings.Contains(res.stdout, "would resend 3 delivered events") || e.count("true") != 4 {
		t.Fatalf("dry run: %s; rows %d, want 4", res, e.count("true"))
	}
	if res := runBinary(t, e.vars, 30*time.Second, "resend"); res.code != 2 || !strings.Contains(res.stderr, "--all") {
		t.Fatalf("resend without a filter: %s, want exit 2 naming --all", res)
	}

	// Held: the aggregate's next event stays pending while the resend runs.
	if code, body := rep.post("/admin/pause", "Bearer "+adminToken, `{"all":true,"wait":"10s"}`); code != http.StatusOK {
		t.Fatalf("pause: %d %s", code, body)
	}
	pending := e.insert("deal", "7", `{"n":3}`, "")
	res = runBinary(t, e.vars, 60*time.Second, "resend", "--aggregate", "deal/7", "--via", "http://"+rep.addr, "--token-file", tokenFile)
	if res.code != 0 || !strings.Contains(res.stdout, "resent 3 delivered events") {
		t.Fatalf("resend --via: %s", res)
	}
	later := e.insert("deal", "7", `{"n":4}`, "")
	if code, body := rep.post("/admin/resume", "Bearer "+adminToken, `{"all":true}`); code != http.StatusOK {
		t.Fatalf("resume: %d %s", code, body)
	}
	rc.WaitDelivered(t, 30*time.Second, 4+3+2)

	var got []string
	for _, r := range rc.Requests() {
		if r.OK() && r.Agg == "deal/7" {
			got = append(got, strconv.FormatInt(r.ID, 10)+"<"+r.Header.Get("Outbox-Resent-From"))
		}
		if r.ID == other && r.Attempt > 1 {
			t.Errorf("deal/8's event %d was sent again", other)
		}
	}
	copies := e.rows("aggregate_id = '7' AND headers ? 'outbox-resent-from'")
	if len(copies) != 3 {
		t.Fatalf("copies: %v", copies)
	}
	want := []string{}
	for _, id := range first {
		want = append(want, strconv.FormatInt(id, 10)+"<")
	}
	want = append(want, strconv.FormatInt(pending, 10)+"<")
	for i, c := range copies {
		want = append(want, strconv.FormatInt(c.ID, 10)+"<"+strconv.FormatInt(first[i], 10))
	}
	want = append(want, strconv.FormatInt(later, 10)+"<")
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("deal/7 arrived as (id<resent-from)\n %v\nwant\n %v", got, want)
	}
	var kinds string
	if err := e.pool.QueryRow(context.Background(), `SELECT string_agg(outbox_id || ':' || kind || ':' || excerpt, ',' ORDER BY outbox_id, attempt) FROM outbox_attempts`).Scan(&kinds); err != nil {
		t.Fatal(err)
	}
	for i, c := range copies {
		for _, entry := range []string{strconv.FormatInt(first[i], 10) + ":resend:resent as " + strconv.FormatInt(c.ID, 10), strconv.FormatInt(c.ID, 10) + ":resend:copy of " + strconv.FormatInt(first[i], 10)} {
			if !strings.Contains(kinds, entry) {
				t.Errorf("attempt history lacks %q: %s", entry, kinds)
			}
		}
	}
	if len(rep.logsMatching(func(_ string, rec map[string]any) bool {
		return rec["msg"] == "admin write" && rec["caller"] == "oncall" && rec["op"] == "resend" && rec["resent"] == float64(3)
	})) != 1 {
		t.Errorf("no \"admin write\" line naming the caller oncall and resent 3: %s", rep.tail(20))
	}
	// Without routing the one destination is "default": it selects every
	// row; any other name is refused, exit 2 naming it.
	res = runBinary(t, e.vars, 30*time.Second, "resend", "--aggregate", "deal/8", "--destination", "default", "--dry-run")
	if res.code != 0 || !strings.Contains(res.stdout, "would resend 1 delivered events") {
		t.Fatalf("resend --destination default: %s", res)
	}
	res = runBinary(t, e.vars, 30*time.Second, "resend", "--aggregate", "deal/8", "--destination", "crm", "--dry-run")
	if res.code != 2 || !strings.Contains(res.stderr, `unknown destination "crm"`) {
		t.Fatalf("resend --destination crm without routing: %s, want exit 2 naming crm", res)
	}
	// Asked by id, a purged row is reported as gone.
	res = runBinary(t, e.vars, 30*time.Second, "resend", "--id", "999999", "--dry-run")
	if res.code != 0 || !strings.Contains(res.stdout, "gone (purged past reconcile.retention, discarded or never written): 999999") {
		t.Fatalf("resend of a missing id: %s", res)
	}
}

// `resend --destination` with two destinations routed by aggregate_type
// resends only the rows routed to the one named, in order, through the
// CLI and --via alike: the dry run counts only them, --limit applies after
// the destination, an unknown destination exits 2 naming it, and no other
// filter still needs --all.
func TestResendToOneDestination(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ra, rb := newRecorder(t, nil), newRecorder(t, nil)
	tokenFile := withAdminToken(t, e)
	cfg := filepath.Join(t.TempDir(), "routed.yaml")
	if err := os.WriteFile(cfg, []byte(`
dispatch:
  destinations:
    a: {sink: webhook, webhook: {url: "`+ra.URL()+`"}}
    b: {sink: webhook, webhook: {url: "`+rb.URL()+`"}}
  routes:
    - {aggregate_type: alpha, to: a}
    - {aggregate_type: "*", to: b}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	var alpha []int64
	for i := range 3 {
		alpha = append(alpha, e.insert("alpha", "1", `{"n":`+strconv.Itoa(i)+`}`, ""))
		e.insert("beta", "1", `{"n":`+strconv.Itoa(i)+`}`, "")
	}
	rep := e.start("--config", cfg)
	ra.WaitDelivered(t, 30*time.Second, 3)
	rb.WaitDelivered(t, 30*time.Second, 3)

	cli := func(args ...string) result {
		return runBinary(t, e.vars, 60*time.Second, append([]string{"resend", "--config", cfg}, args...)...)
	}
	via := []string{"--via", "http://" + rep.addr, "--token-file", tokenFile}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--all", "--destination", "a", "--dry-run"}, "would resend 3 delivered events"},
		{append([]string{"--all", "--destination", "b", "--dry-run"}, via...), "would resend 3 delivered events"},
		{[]string{"--all", "--destination", "a", "--limit", "2", "--dry-run"}, "would resend 2 delivered events"},
		{[]string{"--event-type", "nothing.*", "--destination", "a", "--dry-run"}, "would resend 0 delivered events"},
	} {
		if res := cli(c.args...); res.code != 0 || !strings.Contains(res.stdout, c.want) {
			t.Fatalf("resend %v: %s, want %q", c.args, res, c.want)
		}
	}
	for _, args := range [][]string{{"--all", "--destination", "nope"}, append([]string{"--all", "--destination", "nope"}, via...)} {
		if res := cli(args...); res.code != 2 || !strings.Contains(res.stderr, `unknown destination "nope"`) {
			t.Fatalf("resend %v: %s, want exit 2 naming nope", args, res)
		}
	}
	if res := cli("--destination", "a"); res.code != 2 || !strings.Contains(res.stderr, "--all") {
		t.Fatalf("resend --destination a without a filter: %s, want exit 2 naming --all", res)
	}
	if e.count("headers ? 'outbox-resent-from'") != 0 {
		t.Fatalf("a dry run or a refusal resent rows: %s", e.describeRows("true")())
	}

	if res := cli("--all", "--destination", "a"); res.code != 0 || !strings.Contains(res.stdout, "resent 3 delivered events") {
		t.Fatalf("resend --all --destination a: %s", res)
	}
	ra.WaitDelivered(t, 30*time.Second, 6)
	if n := e.count("aggregate_type <> 'alpha' AND headers ? 'outbox-resent-from'"); n != 0 {
		t.Fatalf("%d rows routed to b were resent: %s", n, e.describeRows("true")())
	}
	copies := e.rows("aggregate_type = 'alpha' AND headers ? 'outbox-resent-from'")
	var got, want []string
	for _, r := range ra.Requests() {
		if r.OK() {
			got = append(got, strconv.FormatInt(r.ID, 10)+"<"+r.Header.Get("Outbox-Resent-From"))
		}
	}
	for _, id := range alpha {
		want = append(want, strconv.FormatInt(id, 10)+"<")
	}
	for i, c := range copies {
		want = append(want, strconv.FormatInt(c.ID, 10)+"<"+strconv.FormatInt(alpha[i], 10))
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("destination a got (id<resent-from)\n %v\nwant\n %v", got, want)
	}
}

// adminWrites are every write of the admin API, each with a body that
// changes something.
var adminWrites = []struct{ path, body string }{
	{"/admin/pause", `{"all":true}`},
	{"/admin/resume", `{"all":true}`},
	{"/admin/replay", `{}`},
	{"/admin/discard", `{"all":true}`},
	{"/admin/resend", `{"all":true}`},
}

// Every admin-API write is refused 401 without the token or with a wrong
// one (and on a relay with no token at all, on loopback too), and 409 when
// lock:reconciliation's fence is raised by a newer holder while it waits
// to write: nothing changes then.
func TestAdminWritesRefuseMissingTokenAndStaleFence(t *testing.T) {
	t.Parallel()
	e := setup(t)
	withAdminToken(t, e)
	e.set("OUTBOXD_DISPATCH_SINK", "noop")
	rep := e.start()
	ctx := context.Background()
	for _, w := range adminWrites {
		for _, auth := range []string{"", "Bearer wrong", "Bearer " + adminToken + "x"} {
			if code, body := rep.post(w.path, auth, w.body); code != http.StatusUnauthorized {
				t.Errorf("%s with Authorization %q: %d, want 401: %s", w.path, auth, code, trunc(body, 200))
			}
		}
	}
	open := setup(t).set("OUTBOXD_DISPATCH_SINK", "noop").start()
	for _, w := range adminWrites {
		if code, body := open.post(w.path, "", w.body); code != http.StatusUnauthorized {
			t.Errorf("%s on a relay without a token: %d, want 401: %s", w.path, code, trunc(body, 200))
		}
	}

	if _, err := e.pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, attempts, dead_at, dispatched_at)
VALUES ('deal', '1', 'x', '{}', 3, now(), NULL), ('deal', '2', 'x', '{}', 0, NULL, now())`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `INSERT INTO outbox_fence (lock_name, token) VALUES ('lock:reconciliation', 0) ON CONFLICT DO NOTHING`); err != nil {
		t.Fatal(err)
	}
	before := e.count("true")
	for _, w := range adminWrites {
		t.Run(strings.TrimPrefix(w.path, "/admin/"), func(t *testing.T) {
			tx, err := e.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			if _, err := tx.Exec(ctx, `SELECT 1 FROM outbox_fence WHERE lock_name = 'lock:reconciliation' FOR UPDATE`); err != nil {
				t.Fatal(err)
			}
			type answer struct {
				code int
				body string
			}
			done := make(chan answer, 1)
			go func() {
				code, body := rep.post(w.path, "Bearer "+adminToken, w.body)
				done <- answer{code, body}
			}()
			waitFor(t, "the write to wait on the fence row", func() bool {
				var n int
				_ = e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
AND wait_event_type = 'Lock' AND query LIKE '%outbox_fence%'`).Scan(&n)
				return n > 0
			}, func() string { return "no backend waits on outbox_fence" })
			if _, err := tx.Exec(ctx, `UPDATE outbox_fence SET token = token + 1000000 WHERE lock_name = 'lock:reconciliation'`); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			a := <-done
			if a.code != http.StatusConflict || !strings.Contains(a.body, "stale fence") {
				t.Errorf("%s under a stale fence: %d, want 409: %s", w.path, a.code, trunc(a.body, 300))
			}
		})
	}
	if got := e.count("true"); got != before || e.count("dead_at IS NOT NULL") != 1 {
		t.Errorf("rows %d (dead %d) after refused writes, want %d (dead 1)", got, e.count("dead_at IS NOT NULL"), before)
	}
	var paused int
	_ = e.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_paused`).Scan(&paused)
	if paused != 0 {
		t.Errorf("%d destinations paused by a refused write", paused)
	}
}

// A replay (here --via the admin API) keeps the rows' attempt history: the
// failures before it, an entry of kind replay, then the failures after it.
func TestReplayKeepsAttemptHistory(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rc := newRecorder(t, testkit.Statuses(map[string]int{"deal/bad": http.StatusServiceUnavailable}))
	tokenFile := withAdminToken(t, e)
	e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", rc.URL())
	ctx := context.Background()
	var id int64
	if err := e.pool.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, attempts, last_error, dead_at)
VALUES ('deal', 'bad', 'x', '{}', 2, 'receiver answered 503', now()) RETURNING id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `INSERT INTO outbox_attempts (outbox_id, attempt, created_at, kind, excerpt, fencing_token)
SELECT id, a, created_at, 'http_503', 'before the replay', 1 FROM outbox, generate_series(1, 2) a WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	rep := e.start()
	res := runBinary(t, e.vars, 60*time.Second, "replay", "--dead", "--id", strconv.FormatInt(id, 10), "--via", "http://"+rep.addr, "--token-file", tokenFile)
	if res.code != 0 || !strings.Contains(res.stdout, "requeued 1 dead-lettered events") {
		t.Fatalf("replay --via: %s", res)
	}
	history := func() string {
		var h string
		_ = e.pool.QueryRow(ctx, `SELECT string_agg(attempt || ':' || kind || ':' || excerpt, ',' ORDER BY attempt) FROM outbox_attempts WHERE outbox_id = $1`, id).Scan(&h)
		return h
	}
	waitFor(t, "two failures after the replay", func() bool { return strings.Count(history(), "http_503") >= 4 }, history)
	h := history()
	if !strings.HasPrefix(h, "1:http_503:before the replay,2:http_503:before the replay,3:replay:requeued by replay,4:http_503:") {
		t.Fatalf("history after a replay: %s", h)
	}
}

// `status`, `dead list`, `dead show`, `pause` and `resume` with --via print
// what the commands print locally (the dead-letter list and row the same
// text), reads need the token where the relay guards them and go without
// it where it does not, and a pause needs the token always: paused through
// the API, the destination shows as paused, and an event written then is
// delivered after a resume through it.
func TestViaReadsAndPauseMatchTheLocalCommands(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rc := newRecorder(t, nil)
	tokenFile := withAdminToken(t, e)
	e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", rc.URL())
	rep := e.start()
	if _, err := e.pool.Exec(context.Background(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, attempts, dead_at, last_error)
VALUES ('deal', '1', 'deal.lost', '{"n":1}', 3, now(), 'receiver said 422')`); err != nil {
		t.Fatal(err)
	}
	dead := e.rows("dead_at IS NOT NULL")[0].ID
	via := []string{"--via", "http://" + rep.addr, "--token-file", tokenFile}
	run := func(args ...string) result { return runBinary(t, e.vars, 60*time.Second, args...) }

	for _, args := range [][]string{{"dead", "list"}, {"dead", "list", "--aggregate", "deal", "--json"}, {"dead", "show", strconv.FormatInt(dead, 10)}} {
		local, remote := run(args...), run(append(args, via...)...)
		if local.code != 0 || remote.code != 0 || remote.stdout != local.stdout || !strings.Contains(remote.stdout, "receiver said 422") {
			t.Fatalf("%v: locally %s\nvia the API %s", args, local, remote)
		}
	}
	if res := run("dead", "show", "999999", "--via", "http://"+rep.addr, "--token-file", tokenFile); res.code != 1 || !strings.Contains(res.stderr, "404") {
		t.Fatalf("dead show of a missing row --via: %s, want exit 1 with the 404", res)
	}
	if res := run("dead", "list", "--via", "http://"+rep.addr); res.code != 1 || !strings.Contains(res.stderr, "401") {
		t.Fatalf("dead list --via without the token of a relay that has one: %s, want exit 1 with the 401", res)
	}
	res := run(append([]string{"status"}, via...)...)
	if res.code != 0 || !strings.Contains(res.stdout, "lock:outbox:poller") || !strings.Contains(res.stdout, "dead 1") {
		t.Fatalf("status --via: %s", res)
	}
	res = run(append([]string{"status", "--json"}, via...)...)
	var st struct {
		Locks []struct {
			Name string `json:"name"`
		} `json:"locks"`
		Dead int `json:"dead"`
	}
	if res.code != 0 || json.Unmarshal([]byte(res.stdout), &st) != nil || len(st.Locks) == 0 || st.Dead != 1 {
		t.Fatalf("status --json --via: %s", res)
	}
	open := setup(t).set("OUTBOXD_DISPATCH_SINK", "noop").start()
	if res := run("status", "--via", "http://"+open.addr); res.code != 0 || !strings.Contains(res.stdout, "lock:outbox:poller") {
		t.Fatalf("status --via a relay without a token, on loopback, without one: %s", res)
	}

	if res := run("pause", "default", "--via", "http://"+rep.addr); res.code != 2 || !strings.Contains(res.stderr, "token") {
		t.Fatalf("pause --via without a token: %s, want exit 2 asking for one", res)
	}
	if res := run(append([]string{"pause", "nope"}, via...)...); res.code != 2 || !strings.Contains(res.stderr, `"nope"`) {
		t.Fatalf("pause nope --via: %s, want exit 2 naming it", res)
	}
	if res := run(append([]string{"pause", "default"}, via...)...); res.code != 0 || !strings.Contains(res.stdout, "destinations paused") ||
		!strings.Contains(res.stdout, "acknowledged by the leader") {
		t.Fatalf("pause default --via: %s", res)
	}
	if res := run(append([]string{"status", "--json"}, via...)...); !strings.Contains(res.stdout, `"paused": true`) {
		t.Fatalf("status after a pause --via: %s", res)
	}
	held := e.insert("deal", "2", `{}`, "")
	if res := run(append([]string{"resume", "--all"}, via...)...); res.code != 0 || !strings.Contains(res.stdout, "destinations resumed") {
		t.Fatalf("resume --all --via: %s", res)
	}
	waitFor(t, "the event written while paused delivered after the resume", func() bool { return e.row(held).Dispatched }, e.describeRows("true"))
}
