package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/app"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/internal/testkit"
	"github.com/outboxd/outboxd/store"
)

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// metricValue finds `name{labels} value` (or `name value`) in an exposition.
func metricValue(t *testing.T, body, series string) float64 {
	t.Helper()
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, series+" ") {
			v, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimPrefix(line, series)), 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	t.Fatalf("series %s not exported", series)
	return 0
}

func TestOperationsEndpointsWithTwoReplicas(t *testing.T) {
	t.Parallel()
	// whsec_ of base64("secret-webhook"): the receiver checks with the raw bytes.
	const pgSecret, webhookSecret = "pg-s3cret-value", "whsec_c2VjcmV0LXdlYmhvb2s="
	b := setup(t, "secret-webhook")
	st := b.st
	redisSrv := testenv.StartRedisServer(t) // stopped below: the test's own
	ctx := context.Background()
	// Trust auth accepts any password, so the DSN can carry one to prove it is never shown.
	dsnWithPassword := strings.Replace(b.dsn, "postgres@", "postgres:"+pgSecret+"@", 1)

	type replica struct {
		addr string
		app  *app.App
		logs *testkit.Logs
		stop func() // requires a clean exit
	}
	var reps []*replica
	for range 2 {
		addr := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
		logs := &testkit.Logs{}
		a := newApp(t, logs, "debug", b.sets(
			"postgres.dsn="+dsnWithPassword, "redis.addrs="+redisSrv.Addr, "redis.key_prefix=",
			"dispatch.webhook.secret="+webhookSecret,
			"http.addr="+addr, "poller.poll_interval=10ms", "poller.lock_ttl=2s", "dispatch.webhook.timeout=1s",
		)...)
		reps = append(reps, &replica{addr: addr, app: a, logs: logs, stop: runApp(t, a)})
	}
	err := pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error {
		var evs []store.Event
		for i := range 50 {
			evs = append(evs, store.Event{AggregateType: "deal", AggregateID: strconv.Itoa(i % 5), EventType: "deal.funded",
				Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))})
		}
		return store.Enqueue(ctx, tx, evs...)
	})
	if err != nil {
		t.Fatal(err)
	}
	b.rc.WaitDelivered(t, 30*time.Second, 50)
	waitAllMarked(t, st)

	// /status: exactly one leader, whose token Postgres and Redis agree on.
	var leader *replica
	var token int64
	for _, r := range reps {
		code, body := httpGet(t, "http://"+r.addr+"/status")
		if code != 200 {
			t.Fatalf("/status %d: %s", code, body)
		}
		var s app.Status
		if err := json.Unmarshal([]byte(body), &s); err != nil {
			t.Fatal(err)
		}
		if s.Locks[0].Name != "lock:outbox:poller" || s.Locks[1].Name != "lock:reconciliation" {
			t.Fatalf("locks %+v", s.Locks)
		}
		if d := s.Destinations; len(d) != 1 || d[0].Name != "default" || d[0].Sink != "webhook" || d[0].Key != "dispatch" || d[0].Ordering == "" {
			t.Fatalf("destinations %+v, want the default webhook with its sink's ordering", d)
		}
		if s.Locks[0].HeldByMe {
			if leader != nil {
				t.Fatal("two replicas report holding lock:outbox:poller")
			}
			leader, token = r, s.Locks[0].Token
		}
		if strings.Contains(body, pgSecret) || strings.Contains(body, webhookSecret) {
			t.Fatalf("/status shows a secret: %s", body)
		}
	}
	if leader == nil || token < 1 {
		t.Fatal("no replica reports leading")
	}
	cli, err := reps[0].app.Status(ctx) // what `outboxd status --json` prints
	if err != nil {
		t.Fatal(err)
	}
	l := cli.Locks[0]
	if l.Owner == "" || l.TTLMillis <= 0 || l.TTLMillis > 2000 || l.FenceToken != token || l.RedisCounter != token || cli.Pending != 0 {
		t.Fatalf("status %+v, want owner, TTL <= 2s and token %d in Postgres and Redis", cli, token)
	}

	// /metrics: contract names, with the run's values. A batch is counted
	// just after its mark, which this test saw first.
	var body string
	// The single sink is the destination "default" (the label of sends).
	const dispatched = `outboxd_dispatched_total{destination="default"}`
	testkit.WaitFor(t, 10*time.Second, "outboxd_dispatched_total to reach 50", func() bool {
		_, body = httpGet(t, "http://"+leader.addr+"/metrics")
		return metricValue(t, body, dispatched) >= 50
	}, nil)
	if v := metricValue(t, body, dispatched); v != 50 {
		t.Fatalf("outboxd_dispatched_total %v, want 50", v)
	}
	if v := metricValue(t, body, `outboxd_lock_held{lock="lock:outbox:poller"}`); v != 1 {
		t.Fatalf("leader's outboxd_lock_held %v", v)
	}
	if v := metricValue(t, body, `outboxd_dispatch_latency_seconds_count{destination="default"}`); v != 50 {
		t.Fatalf("latency observations %v, want 50", v)
	}
	for _, s := range []string{`outboxd_dispatch_failures_total{destination="default",reason="http_5xx"}`, `outboxd_dead_lettered_total{destination="default"}`,
		`outboxd_fence_rejections_total{lock="lock:outbox:poller"}`, "outboxd_pending_events", "outboxd_oldest_pending_age_seconds"} {
		if v := metricValue(t, body, s); v != 0 {
			t.Fatalf("%s = %v, want 0", s, v)
		}
	}
	for _, r := range reps {
		if r != leader {
			_, body := httpGet(t, "http://"+r.addr+"/metrics")
			if v := metricValue(t, body, `outboxd_lock_held{lock="lock:outbox:poller"}`); v != 0 {
				t.Fatalf("standby's outboxd_lock_held %v", v)
			}
		}
	}

	// /readyz: a standby is ready; Redis down makes both unready, and ready again after.
	for _, r := range reps {
		if code, body := httpGet(t, "http://"+r.addr+"/readyz"); code != 200 {
			t.Fatalf("/readyz %d: %s", code, body)
		}
		if code, _ := httpGet(t, "http://"+r.addr+"/livez"); code != 200 {
			t.Fatal("/livez")
		}
	}
	redisSrv.Stop()
	code, body := httpGet(t, "http://"+reps[0].addr+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "redis") {
		t.Fatalf("/readyz with Redis down: %d %s", code, body)
	}
	redisSrv.Start()
	testkit.WaitFor(t, 10*time.Second, "/readyz to recover after Redis came back", func() bool {
		code, _ := httpGet(t, "http://"+reps[0].addr+"/readyz")
		return code == 200
	}, nil)

	for _, r := range reps {
		r.stop()
		if logs := r.logs.String(); strings.Contains(logs, pgSecret) || strings.Contains(logs, webhookSecret) {
			t.Fatal("a secret appears in the logs")
		}
	}
	shown, _ := json.Marshal(reps[0].app.Cfg.Redacted()) // what `outboxd config` prints
	if strings.Contains(string(shown), pgSecret) || strings.Contains(string(shown), webhookSecret) {
		t.Fatalf("config output shows a secret: %s", shown)
	}
	checkContract(t, b.rc.Requests(), []byte(b.secret))
}
