package blackbox

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
)

// crowdDeadRows is how many dead rows the crowd of /dead readers filters
// through: enough that each read holds a connection while the relay drains.
const crowdDeadRows = 200_000

// A crowd of /dead readers never starves delivery: with 32 clients
// reading /dead?error=zzznotfound&limit=1000 (a filter that walks every
// dead row) without pause, a backlog still drains to the last event, no
// batch fails for want of a connection (the relay's reads of the paused
// destinations among them), and readers beyond http.max_concurrent are
// answered 503 with Retry-After rather than queued.
func TestDeadReadersNeverStarveDelivery(t *testing.T) {
	t.Parallel()
	e := setup(t)
	if _, err := e.pool.Exec(context.Background(), `
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, attempts, last_error, dead_at)
SELECT 'old', (g % 1000)::text, 'old.event', '{}', 25, 'HTTP 500', now() - g * interval '1 second'
FROM generate_series(1, $1::int) g`, crowdDeadRows); err != nil {
		t.Fatal(err)
	}
	// A read's deadline follows the lock TTL: 10 s keeps a read slowed by a
	// loaded machine's CPU from failing, so an error line here means a
	// batch waited for a connection, not for a core.
	e.set("OUTBOXD_DISPATCH_SINK", "noop", "OUTBOXD_POLLER_BATCH_SIZE", "50", "OUTBOXD_POLLER_LOCK_TTL", "10s")
	rep := e.start()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	retryAfterMissing := 0
	client := &http.Client{}
	for range 32 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := client.Get("http://" + rep.addr + "/dead?error=zzznotfound&limit=1000")
				if err != nil {
					continue
				}
				_ = resp.Body.Close()
				mu.Lock()
				codes[resp.StatusCode]++
				if resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") == "" {
					retryAfterMissing++
				}
				mu.Unlock()
			}
		})
	}
	// The readers' queries run on the operations pool's sessions (named
	// "outboxd ops"), never on one of the delivery's.
	var names []string
	waitFor(t, "a /dead query seen in pg_stat_activity", func() bool {
		rows, err := e.pool.Query(context.Background(), `SELECT application_name FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND query LIKE '%ORDER BY dead_at DESC%'`)
		if err != nil {
			t.Fatal(err)
		}
		more, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, more...)
		return len(names) > 0
	}, func() string { return "none" })
	ids := e.insertMany("new", 100, 10)
	waitFor(t, "every new event delivered beside the /dead readers", func() bool {
		return e.count("aggregate_type = 'new' AND dispatched_at IS NOT NULL") == len(ids)
	}, e.describeRows("aggregate_type = 'new' AND dispatched_at IS NULL"))
	close(stop)
	wg.Wait()

	if bad := rep.logsMatching(func(line string, rec map[string]any) bool {
		return rec != nil && (rec["level"] == "ERROR" || strings.Contains(line, "reading the paused destinations"))
	}); len(bad) > 0 {
		t.Errorf("%d error line(s) beside the /dead readers, first: %s", len(bad), trunc(bad[0], 400))
	}
	for _, n := range names {
		if n != "outboxd ops" {
			t.Errorf("a /dead query ran on a session named %q, want every one on the operations pool's (%q)", n, "outboxd ops")
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if codes[http.StatusServiceUnavailable] == 0 || retryAfterMissing > 0 {
		t.Errorf("answers to the readers %v (%d 503 without Retry-After): want some 503 with Retry-After beyond http.max_concurrent", codes, retryAfterMissing)
	}
	t.Logf("answers to the readers: %v", codes)
}

// On an address off loopback without a token, /dead, /dead/{id} and
// pprof answer 403 naming http.auth_token_file, the start logs one WARN
// saying so, and /metrics, /livez, /readyz and /status serve as before.
func TestOffLoopbackWithoutTokenRefusesPayloads(t *testing.T) {
	t.Parallel()
	e := setup(t)
	id := e.insert("deal", "1", `{"iban": "DE89370400440532013000"}`, "")
	if _, err := e.pool.Exec(context.Background(), `UPDATE outbox SET dead_at = now(), attempts = 25 WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	addr := strings.Replace(e.vars["OUTBOXD_HTTP_ADDR"], "127.0.0.1", "0.0.0.0", 1)
	e.set("OUTBOXD_HTTP_ADDR", addr, "OUTBOXD_HTTP_PPROF", "true", "OUTBOXD_DISPATCH_SINK", "noop")
	rep := e.start()
	for _, path := range []string{"/dead", "/dead/" + strconv.FormatInt(id, 10), "/debug/pprof/", "/debug/pprof/cmdline"} {
		code, body := rep.getWith(path, "")
		if code != http.StatusForbidden || !strings.Contains(body, "http.auth_token_file") || strings.Contains(body, "DE89") {
			t.Errorf("GET %s on %s without a token: %d %s, want 403 naming http.auth_token_file", path, addr, code, trunc(body, 200))
		}
	}
	for _, path := range []string{"/metrics", "/livez", "/readyz", "/status"} {
		if code, body := rep.getWith(path, ""); code != http.StatusOK {
			t.Errorf("GET %s on %s without a token: %d %s, want 200", path, addr, code, trunc(body, 200))
		}
	}
	warns := rep.logsMatching(func(line string, rec map[string]any) bool {
		return rec != nil && rec["level"] == "WARN" && strings.Contains(line, "http.auth_token_file")
	})
	if len(warns) != 1 {
		t.Errorf("%d WARN lines naming http.auth_token_file at start, want 1: %v", len(warns), warns)
	}
}
