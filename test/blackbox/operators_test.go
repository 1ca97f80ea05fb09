package blackbox

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testkit"
)

// instance_id names the holder wherever the holder is shown: the lock log
// lines ("holder", beside fencing_token), /status and `outboxd status`.
func TestInstanceIDNamesTheLockHolder(t *testing.T) {
	t.Parallel()
	e := setup(t).set("OUTBOXD_INSTANCE_ID", "relay-7", "OUTBOXD_DISPATCH_SINK", "noop")
	rep := e.start()
	holderLine := func(msg string) func(string, map[string]any) bool {
		return func(_ string, rec map[string]any) bool {
			return rec["msg"] == msg && rec["lock"] == "lock:outbox:poller" && rec["holder"] == "relay-7" && rec["fencing_token"] != nil
		}
	}
	if !rep.awaitLog(waitTimeout, holderLine("lock acquired")) {
		t.Fatalf("no lock acquired line with holder relay-7; logs:\n%s", rep.tail(20))
	}
	_, body := rep.get("/status")
	var st struct {
		Locks []struct {
			Name   string `json:"name"`
			Holder string `json:"holder"`
			Owner  string `json:"owner"`
			Token  int64  `json:"token"`
		} `json:"locks"`
	}
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("/status: %v: %s", err, body)
	}
	found := false
	for _, l := range st.Locks {
		if l.Name == "lock:outbox:poller" {
			found = l.Holder == "relay-7" && l.Owner != "" && l.Token > 0
		}
	}
	if !found {
		t.Fatalf("/status: want lock:outbox:poller held by relay-7 with owner and token: %s", body)
	}
	res := runBinary(t, e.vars, 30*time.Second, "status")
	if res.code != 0 || !strings.Contains(res.stdout, "relay-7") {
		t.Fatalf("outboxd status: want the holder relay-7: %s", res)
	}
	rep.stop()
	if len(rep.logsMatching(holderLine("lock released"))) != 1 {
		t.Fatalf("no lock released line with holder relay-7; logs:\n%s", rep.tail(20))
	}
}

// metricLine is the value of the series exactly as written in /metrics
// (name{labels}), and whether it is there.
func metricLine(body, series string) (float64, bool) {
	for _, l := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return f, err == nil
		}
	}
	return 0, false
}

// The operators' series: every counter is there from the start at 0 (the
// lock and reconciliation ones included); a failure carries its reason
// (a 500 is http_5xx, a 410 http_4xx) and the destination; a dead letter
// its destination; each send's duration is a histogram by destination and
// outcome; outboxd_build_info says which build runs.
func TestOperatorsMetrics(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rc := newRecorder(t, func(req testkit.Request) testkit.Reply {
		switch req.Agg {
		case "retry/1":
			return testkit.Reply{Status: 500}
		case "gone/1":
			return testkit.Reply{Status: 410}
		}
		return testkit.Reply{}
	})
	e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", rc.URL())
	rep := e.start()
	_, body := rep.get("/metrics")
	for _, s := range []string{
		`outboxd_lock_losses_total{lock="lock:outbox:poller"}`, `outboxd_lock_renew_failures_total{lock="lock:reconciliation"}`,
		`outboxd_reconcile_runs_total{result="failed"}`, `outboxd_reconcile_rows_total{sweep="purged_dead"}`,
		`outboxd_dispatch_failures_total{destination="default",reason="timeout"}`, `outboxd_dead_lettered_total{destination="default"}`,
		`outboxd_send_duration_seconds_count{destination="default",outcome="retryable"}`,
	} {
		if v, ok := metricLine(body, s); !ok || v != 0 {
			t.Errorf("at start: %s = %v (there: %v), want 0", s, v, ok)
		}
	}
	if !strings.Contains(body, `outboxd_build_info{commit=`) {
		t.Errorf("no outboxd_build_info in /metrics")
	}
	e.insert("ok", "1", `{}`, "")
	e.insert("retry", "1", `{}`, "")
	e.insert("gone", "1", `{}`, "")
	waitFor(t, "the failures counted by reason", func() bool {
		_, body = rep.get("/metrics")
		f5, _ := metricLine(body, `outboxd_dispatch_failures_total{destination="default",reason="http_5xx"}`)
		f4, _ := metricLine(body, `outboxd_dispatch_failures_total{destination="default",reason="http_4xx"}`)
		dead, _ := metricLine(body, `outboxd_dead_lettered_total{destination="default"}`)
		ok, _ := metricLine(body, `outboxd_send_duration_seconds_count{destination="default",outcome="delivered"}`)
		retry, _ := metricLine(body, `outboxd_send_duration_seconds_count{destination="default",outcome="retryable"}`)
		perm, _ := metricLine(body, `outboxd_send_duration_seconds_count{destination="default",outcome="permanent"}`)
		return f5 >= 1 && f4 == 1 && dead == 1 && ok >= 1 && retry >= 1 && perm == 1
	}, func() string { return body })
}

// getWith fetches path on the replica's operations port with an
// Authorization header ("" sends none): status and body. As an operator's
// client does, it waits out a refusal by http.max_concurrent (503 with
// Retry-After: the port's share of the host is spent) and asks again, for
// up to busyRetryFor.
func (r *replica) getWith(path, authorization string) (int, string) {
	deadline := time.Now().Add(busyRetryFor)
	for {
		code, retry, body := r.getOnce(path, authorization)
		if code != http.StatusServiceUnavailable || retry == 0 || !strings.Contains(body, "http.max_concurrent") ||
			time.Now().Add(retry).After(deadline) {
			return code, body
		}
		time.Sleep(retry)
	}
}

// busyRetryFor is how long getWith waits out refusals by
// http.max_concurrent.
const busyRetryFor = 30 * time.Second

// getOnce is one request of getWith: status, Retry-After (0: none) and body.
func (r *replica) getOnce(path, authorization string) (int, time.Duration, string) {
	req, err := http.NewRequest(http.MethodGet, "http://"+r.addr+path, nil)
	if err != nil {
		r.t.Fatal(err)
	}
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return 0, 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	secs, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	return resp.StatusCode, time.Duration(secs) * time.Second, string(b)
}

// With http.auth_token_file, /metrics, /status and /dead answer 401
// without the bearer token (or with another one) and 200 with it; /livez
// and /readyz stay open; `outboxd config` does not show the token.
func TestHTTPAuthToken(t *testing.T) {
	t.Parallel()
	e := setup(t)
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte("s3cret-op-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.set("OUTBOXD_HTTP_AUTH_TOKEN_FILE", file, "OUTBOXD_DISPATCH_SINK", "noop")
	rep := e.start()
	for _, path := range []string{"/metrics", "/status", "/dead"} {
		for _, bad := range []string{"", "Bearer wrong", "Bearer s3cret-op-toke", "Basic czNjcmV0LW9wLXRva2Vu", "s3cret-op-token"} {
			if code, body := rep.getWith(path, bad); code != http.StatusUnauthorized || strings.Contains(body, "outboxd_") {
				t.Errorf("%s with Authorization %q: %d, want 401: %s", path, bad, code, trunc(body, 200))
			}
		}
		if code, body := rep.getWith(path, "Bearer s3cret-op-token"); code != http.StatusOK {
			t.Errorf("%s with the token: %d, want 200: %s", path, code, trunc(body, 200))
		}
	}
	for _, path := range []string{"/livez", "/readyz"} {
		if code, _ := rep.getWith(path, ""); code != http.StatusOK {
			t.Errorf("%s without a token: %d, want 200", path, code)
		}
	}
	if res := runBinary(t, e.vars, 30*time.Second, "config"); res.code != 0 || strings.Contains(res.stdout+res.stderr, "s3cret-op-token") {
		t.Fatalf("outboxd config: want exit 0 without the token: %s", res)
	}
	for _, l := range rep.logsMatching(func(line string, _ map[string]any) bool { return strings.Contains(line, "s3cret-op-token") }) {
		t.Errorf("the token is in a log line: %s", l)
	}
}

// `outboxd dead discard` removes exactly the dead rows its filters select,
// printing each, under lock:reconciliation; --dry-run counts them and
// changes nothing; no filter needs --all; pending and delivered rows are
// never touched, and a reconciliation brings nothing back.
func TestDeadDiscardRemovesExactlyTheFilteredRows(t *testing.T) {
	t.Parallel()
	e := setup(t)
	if _, err := e.pool.Exec(context.Background(), `
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, attempts, last_error, dead_at)
SELECT 'deal', (g % 2)::text, CASE WHEN g % 3 = 0 THEN 'deal.funded' ELSE 'deal.closed' END,
  jsonb_build_object('n', g), 25, 'receiver answered 503', now() - g * interval '1 minute'
FROM generate_series(1, 12) g;
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('deal', '1', 'deal.funded', '{}');
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, dispatched_at) VALUES ('deal', '1', 'deal.funded', '{}', now())`); err != nil {
		t.Fatal(err)
	}
	ids := func(where string) []string {
		var out []string
		for _, r := range e.rows(where) {
			out = append(out, strconv.FormatInt(r.ID, 10))
		}
		return out
	}
	funded := ids("dead_at IS NOT NULL AND event_type = 'deal.funded' AND aggregate_id = '1'")
	keep := ids("NOT (dead_at IS NOT NULL AND event_type = 'deal.funded' AND aggregate_id = '1')")
	if len(funded) != 2 || len(keep) != 12 {
		t.Fatalf("setup: %d to discard, %d to keep", len(funded), len(keep))
	}
	filters := []string{"dead", "discard", "--event-type", "deal.fun*", "--aggregate", "deal/1"}

	res := runBinary(t, e.vars, 30*time.Second, append(filters, "--dry-run")...)
	if res.code != 0 || !strings.Contains(res.stdout, "would discard 2 dead-lettered events") || len(ids("true")) != 14 {
		t.Fatalf("dry run: %s; rows now %d, want 14", res, len(ids("true")))
	}
	if res := runBinary(t, e.vars, 30*time.Second, "dead", "discard"); res.code != 2 || !strings.Contains(res.stderr, "--all") {
		t.Fatalf("discard without a filter: %s, want exit 2 naming --all", res)
	}

	res = runBinary(t, e.vars, 30*time.Second, filters...)
	if res.code != 0 || !strings.Contains(res.stdout, "discarded 2 dead-lettered events") {
		t.Fatalf("discard: %s", res)
	}
	for _, id := range funded {
		if !strings.Contains(res.stdout, "discarded "+id+" deal/1 deal.funded\n") {
			t.Errorf("discard does not print row %s: %s", id, res.stdout)
		}
	}
	if got := ids("true"); strings.Join(got, ",") != strings.Join(keep, ",") {
		t.Fatalf("rows left %v, want exactly %v", got, keep)
	}
	if res := runBinary(t, e.vars, 60*time.Second, "reconcile", "--once"); res.code != 0 {
		t.Fatalf("reconcile --once: %s", res)
	}
	if got := ids("true"); strings.Join(got, ",") != strings.Join(keep, ",") {
		t.Fatalf("after a reconciliation rows are %v, want exactly %v", got, keep)
	}
}
