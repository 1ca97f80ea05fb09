package blackbox

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/internal/testkit"
)

// Retry-After is clamped to poller.backoff_max, whether it says
// ten years or overflows a time.Duration, and the batch's write succeeds.
func TestRetryAfterIsClamped(t *testing.T) {
	t.Parallel()
	e := setup(t)
	retryAfter := map[string]string{"ra/tenyears": "315360000", "ra/overflow": "99999999999"}
	rc := newRecorder(t, func(req testkit.Request) testkit.Reply {
		if v, ok := retryAfter[req.Agg]; ok && req.Attempt == 1 {
			return testkit.Reply{Status: http.StatusServiceUnavailable, Header: http.Header{"Retry-After": {v}}}
		}
		return testkit.Reply{Status: http.StatusNoContent}
	})
	e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", rc.URL())
	backoffMax, _ := time.ParseDuration(e.vars["OUTBOXD_POLLER_BACKOFF_MAX"])
	ids := map[string]int64{}
	for agg := range retryAfter {
		ids[agg] = e.insert("ra", strings.TrimPrefix(agg, "ra/"), `{}`, "")
	}
	e.insertMany("ok", 4, 3)
	rep := e.start()

	waitFor(t, "ok rows delivered and both Retry-After rows answered once", func() bool {
		if e.count(`aggregate_type = 'ok' AND dispatched_at IS NULL`) > 0 {
			return false
		}
		for _, id := range ids {
			if w := e.row(id); w.Attempts < 1 && !w.settled() {
				return false
			}
		}
		return true
	}, e.describeRows("aggregate_type = 'ra'"))

	clamped := true
	for agg, id := range ids {
		w := e.row(id)
		first := firstArrival(rc.Requests(), id)
		wait := w.AvailableAt.Sub(first)
		if w.Attempts != 1 || wait > backoffMax+time.Second {
			clamped = false
			t.Errorf("%s (Retry-After %s): want attempts 1 and available_at at most %s after the 503; got %s, available_at %s after it",
				agg, retryAfter[agg], backoffMax+time.Second, w, wait)
		}
	}
	if errs := rep.logsMatching(func(_ string, rec map[string]any) bool { return rec["level"] == "ERROR" }); len(errs) > 0 {
		t.Errorf("the relay logged %d error(s), want none; first: %s", len(errs), trunc(errs[0], 500))
	}
	if !clamped {
		return
	}
	waitFor(t, "both Retry-After rows delivered on their second try", func() bool {
		return e.count(`aggregate_type = 'ra' AND dispatched_at IS NULL`) == 0
	}, e.describeRows("aggregate_type = 'ra'"))
}

func firstArrival(reqs []testkit.Request, id int64) time.Time {
	for _, r := range reqs {
		if r.ID == id {
			return r.At
		}
	}
	return time.Time{}
}

// Rows of ~10 MB are dead-lettered without being loaded whole,
// every other row is delivered, no body above 1 MiB is sent, and the relay's
// peak RSS stays below the Kubernetes manifest's 256 MiB limit.
func TestBigPayloadsBoundedMemory(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var mu sync.Mutex
	maxBody := 0
	rc := newRecorder(t, func(req testkit.Request) testkit.Reply {
		mu.Lock()
		maxBody = max(maxBody, req.BodyLen)
		mu.Unlock()
		return testkit.Reply{Status: http.StatusNoContent}
	})
	e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", rc.URL())
	// 331 rows over 10 aggregates: every 11th is 10 MiB of md5 text (30), one
	// is 10 MiB of 'x' (Postgres stores it compressed to almost nothing), the
	// other 300 are small.
	start := time.Now()
	_, err := e.pool.Exec(context.Background(), `
		INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'mem', (g % 10)::text, CASE WHEN g % 11 = 0 OR g = 160 THEN 'big' ELSE 'small' END,
		       CASE WHEN g % 11 = 0 THEN jsonb_build_object('blob', repeat(md5(g::text), 10*1024*1024/32))
		            WHEN g = 160 THEN jsonb_build_object('blob', repeat('x', 10*1024*1024))
		            ELSE jsonb_build_object('n', g) END
		FROM generate_series(1, 331) g ORDER BY g`)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("inserted 331 rows (31 of ~10 MiB) in %s", time.Since(start).Round(time.Millisecond))
	rep := e.start()

	// Not fatal: whatever state it ends in, the memory figure is reported.
	const limit = 40 * time.Second
	if !testkit.Poll(limit, func() bool { return e.count(`dispatched_at IS NULL AND dead_at IS NULL`) == 0 }) {
		t.Errorf("after %s, %d rows (%d big) still pending, %d delivered, %d dead; logs:\n%s", limit,
			e.count(`dispatched_at IS NULL AND dead_at IS NULL`),
			e.count(`dispatched_at IS NULL AND dead_at IS NULL AND event_type = 'big'`),
			e.count(`dispatched_at IS NOT NULL`), e.count(`dead_at IS NOT NULL`), rep.tail(10))
	}
	rss := rep.peakRSS()
	t.Logf("relay peak RSS (VmHWM) %.1f MiB", float64(rss)/(1<<20))

	if n := e.count(`event_type = 'small' AND dispatched_at IS NULL`); n > 0 {
		t.Errorf("%d of 300 small rows not delivered", n)
	}
	big := e.rows(`event_type = 'big'`)
	var wrong []string
	for _, w := range big {
		if !w.Dead || w.Dispatched || !strings.Contains(w.LastError, "poller.max_payload_bytes") {
			wrong = append(wrong, w.String())
		}
	}
	if len(wrong) > 0 {
		t.Errorf("%d of %d big rows not dead-lettered with a last_error naming poller.max_payload_bytes, e.g.:\n%s",
			len(wrong), len(big), strings.Join(wrong[:min(3, len(wrong))], "\n"))
	}
	mu.Lock()
	defer mu.Unlock()
	if maxBody > 1<<20 {
		t.Errorf("the receiver got a body of %d bytes, want at most 1 MiB", maxBody)
	}
	if rss >= 256<<20 {
		t.Errorf("relay peak RSS %.1f MiB, want below 256 MiB", float64(rss)/(1<<20))
	}
}

// An idempotency key of the wrong type (a hash), or a string
// holding a value the relay never writes, fails its own row (counted, named,
// dead-lettered) and never the batch.
func TestPoisonIdempotencyKeys(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rc := newRecorder(t, nil)
	e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", rc.URL(), "OUTBOXD_POLLER_MAX_ATTEMPTS", "3")
	hashID := e.insert("poison", "hash", `{}`, "")
	strID := e.insert("poison", "garbage", `{}`, "")
	e.insertMany("ok", 5, 4)
	ctx := context.Background()
	key := func(id int64) string { return "idempotency:notify:" + strconv.FormatInt(id, 10) }
	if err := e.rdb.HSet(ctx, e.prefix+key(hashID), "f", "v").Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.Set(ctx, e.prefix+key(strID), "garbage", 0).Err(); err != nil {
		t.Fatal(err)
	}
	e.start()
	e.insertMany("late", 3, 2)

	waitFor(t, "every other row delivered and both poisoned rows dead", func() bool {
		return e.count(`aggregate_type <> 'poison' AND dispatched_at IS NULL`) == 0 &&
			e.count(`aggregate_type = 'poison' AND dead_at IS NULL`) == 0
	}, func() string {
		return fmt.Sprintf("other rows undelivered: %d\n%s", e.count(`aggregate_type <> 'poison' AND dispatched_at IS NULL`),
			e.describeRows("aggregate_type = 'poison'")())
	})
	if w := e.row(hashID); w.Attempts < 2 || !strings.Contains(w.LastError, key(hashID)) ||
		!(strings.Contains(w.LastError, "WRONGTYPE") || strings.Contains(strings.ToLower(w.LastError), "wrong type")) {
		t.Errorf("hash key: want attempts >= 2 and a last_error naming %s and WRONGTYPE; got %s", key(hashID), w)
	}
	if w := e.row(strID); w.Attempts < 2 || !strings.Contains(w.LastError, key(strID)) {
		t.Errorf("string key %q: want attempts >= 2 and a last_error naming %s; got %s", "garbage", key(strID), w)
	}
}

// A fence counter that is not a number is reported loudly (an
// ERROR naming the key, /status), leaves no lock key behind, and the relay
// recovers by itself once the key is fixed.
func TestCorruptFenceCounter(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// A Redis of the test's own, which reports every write to a key
	// (keyspace notifications), so "nothing written" is observed, not
	// sampled.
	srv := testenv.StartRedisServerArgs(t, "--notify-keyspace-events", "KA")
	e.rdb = srv.Client()
	e.set("OUTBOXD_REDIS_ADDRS", srv.Addr, "OUTBOXD_REDIS_DB", "0")
	rc := newRecorder(t, nil)
	e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", rc.URL())
	ctx := context.Background()
	lockKey := e.prefix + "lock:outbox:poller"
	fenceKey := e.prefix + "fence:{" + lockKey + "}"
	if err := e.rdb.Set(ctx, fenceKey, "abc", 0).Err(); err != nil {
		t.Fatal(err)
	}
	barrier := e.prefix + "barrier"
	writes := e.rdb.Subscribe(ctx, "__keyspace@0__:"+lockKey, barrier)
	defer writes.Close()
	for range 2 { // both subscriptions confirmed before the relay starts
		if _, err := writes.Receive(ctx); err != nil {
			t.Fatalf("subscribe to the lock key's keyspace events: %v", err)
		}
	}
	e.insertMany("before", 3, 2)
	rep := e.start()

	errorLine := func(line string, rec map[string]any) bool {
		return rec["level"] == "ERROR" && strings.Contains(line, "fence:{")
	}
	// Not fatal: the checks below say more about what the relay did.
	if !rep.awaitLog(5*time.Second, errorLine) {
		t.Errorf(`no ERROR log line naming "fence:{" within 5s; logs:%s`, "\n"+rep.tail(5))
	}

	// Nothing written by a failed acquire: over several attempts (each
	// logs "lock state corrupted" once it has failed), no write touched the
	// lock key. The barrier, published after the attempts, comes after any
	// keyspace event they caused on the same connection.
	rep.out.WaitLines(t, 30*time.Second, "three failed acquire attempts", 3, func(line string) bool {
		return strings.Contains(line, `"msg":"lock state corrupted"`)
	})
	if err := e.rdb.Publish(ctx, barrier, "end").Err(); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := writes.ReceiveMessage(ctx)
		if err != nil {
			t.Fatalf("keyspace events: %v", err)
		}
		if m.Channel == barrier {
			break
		}
		t.Errorf("a failed acquire wrote the lock key: %s on %s", m.Payload, lockKey)
	}
	if n, err := e.rdb.Exists(ctx, lockKey).Result(); err != nil || n != 0 {
		t.Fatalf("%s exists (%d, err %v) while the fence counter is corrupt", lockKey, n, err)
	}
	resp, err := http.Get("http://" + rep.addr + "/status")
	if err != nil {
		t.Fatalf("GET /status: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !json.Valid(body) || !strings.Contains(string(body), "lock:outbox:poller") ||
		!(strings.Contains(string(body), "fence:{") || strings.Contains(string(body), "corrupt")) {
		t.Errorf("/status (%d) does not say lock:outbox:poller's fence counter is corrupt: %s", resp.StatusCode, body)
	}

	if err := e.rdb.Del(ctx, fenceKey).Err(); err != nil {
		t.Fatal(err)
	}
	e.insertMany("after", 3, 2)
	waitFor(t, "every row delivered once the fence key is deleted", func() bool {
		return e.count(`dispatched_at IS NULL`) == 0
	}, func() string {
		return fmt.Sprintf("undelivered %d; logs:\n%s", e.count(`dispatched_at IS NULL`), rep.tail(10))
	})
}

// Backoff keeps a floor (each wait at least half its step), so 5
// attempts from a 1 s base take at least 7.5 s: a receiver down for 5 s
// dead-letters nothing.
func TestRetriesHaveATimeFloor(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var mu sync.Mutex
	var downUntil time.Time
	rc := newRecorder(t, func(req testkit.Request) testkit.Reply {
		mu.Lock()
		defer mu.Unlock()
		if downUntil.IsZero() {
			downUntil = req.At.Add(5 * time.Second)
		}
		if req.At.Before(downUntil) {
			return testkit.Reply{Status: http.StatusServiceUnavailable}
		}
		return testkit.Reply{Status: http.StatusNoContent}
	})
	e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", rc.URL(), "OUTBOXD_POLLER_MAX_ATTEMPTS", "5",
		"OUTBOXD_POLLER_BACKOFF_BASE", "1s", "OUTBOXD_POLLER_BACKOFF_MAX", "1h")
	e.insertMany("down", 50, 4)
	e.start()

	// Worst case: the 5th attempt of an aggregate at 1+2+4+8 s.
	testkit.WaitFor(t, 30*time.Second, "every row delivered or dead", func() bool {
		return e.count(`dispatched_at IS NULL AND dead_at IS NULL`) == 0
	}, func() string {
		return fmt.Sprintf("pending %d, dead %d", e.count(`dispatched_at IS NULL AND dead_at IS NULL`), e.count(`dead_at IS NOT NULL`))
	})
	if dead := e.rows(`dead_at IS NOT NULL`); len(dead) > 0 {
		t.Errorf("%d of 200 rows dead-lettered during a 5 s outage with 5 attempts from a 1 s base, e.g. %s",
			len(dead), dead[0])
	}
}
