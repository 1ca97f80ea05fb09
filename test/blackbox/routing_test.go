package blackbox

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxd/outboxd/internal/testkit"
)

// Black-box test of routing: one relay, two destinations, a
// webhook receiver ("hook") and a Redis stream per aggregate ("stream");
// the event types of each aggregate alternate between them.
//
// Cross-destination order is checked where it can be checked soundly: at
// the webhook. When the webhook receives an aggregate's event X, every
// earlier stream-bound event of that aggregate must already be in its
// stream (the relay sends X only after they were acknowledged), and on X's
// first arrival no later one may be there yet (the relay sends those only
// after X was acknowledged, which needs this very request's answer). With
// each destination's own per-aggregate order, that covers every pair of an
// aggregate's events.

const (
	routedAggregates = 100
	routedPerAgg     = 100 // 10k events
	routedHoldAfter  = 3000
)

// routedReceiver is the webhook destination: it checks each arrival
// against the aggregate's stream and holds requests once routedHoldAfter
// have arrived, until released (the test kills the leader meanwhile).
type routedReceiver struct {
	t        *testing.T
	rdb      *redis.Client
	prefix   string
	streamed map[string][]int64 // per aggregate_type, its stream-bound ids, ascending

	mu         sync.Mutex
	seen       map[int64]int
	first      map[string][]int64 // per aggregate_type, ids in order of first arrival
	violations []string
	arrivals   int
	holding    chan struct{} // closed when the hold begins
	release    chan struct{}
}

func (rr *routedReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	var ev struct {
		ID            int64  `json:"id"`
		AggregateType string `json:"aggregate_type"`
		EventType     string `json:"event_type"`
	}
	if err != nil || json.Unmarshal(body, &ev) != nil {
		http.Error(w, "bad body", http.StatusBadRequest)
		return
	}
	// What the stream holds now, before this request is answered. Not in
	// the request's context: the relay gives up a request (its 1 s
	// timeout, a killed leader) whose event counts as arrived all the same,
	// and a cancelled XRANGE read as an empty stream (false violations).
	inStream := map[int64]bool{}
	for _, id := range rr.streamIDs(context.WithoutCancel(r.Context()), ev.AggregateType) {
		inStream[id] = true
	}
	rr.mu.Lock()
	firstArrival := rr.seen[ev.ID] == 0
	rr.seen[ev.ID]++
	if firstArrival {
		rr.first[ev.AggregateType] = append(rr.first[ev.AggregateType], ev.ID)
	}
	for _, id := range rr.streamed[ev.AggregateType] {
		switch {
		case id < ev.ID && !inStream[id]:
			rr.violations = append(rr.violations, fmt.Sprintf("%s: webhook got %d before the stream had the earlier %d", ev.AggregateType, ev.ID, id))
		case id > ev.ID && inStream[id] && firstArrival:
			rr.violations = append(rr.violations, fmt.Sprintf("%s: the stream had %d before the webhook got the earlier %d", ev.AggregateType, id, ev.ID))
		}
	}
	if !strings.HasSuffix(ev.EventType, ".notify") {
		rr.violations = append(rr.violations, fmt.Sprintf("webhook got event %d of type %s", ev.ID, ev.EventType))
	}
	rr.arrivals++
	if rr.arrivals == routedHoldAfter {
		close(rr.holding)
	}
	hold := rr.arrivals >= routedHoldAfter
	rr.mu.Unlock()
	if hold {
		select {
		case <-rr.release:
		case <-r.Context().Done():
			return // the relay is gone
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

// streamIDs are the ids in aggregate type aggType's stream, in stream order.
func (rr *routedReceiver) streamIDs(ctx context.Context, aggType string) []int64 {
	entries, err := rr.rdb.XRange(ctx, rr.prefix+"routed."+aggType, "-", "+").Result()
	if err != nil {
		rr.mu.Lock()
		rr.violations = append(rr.violations, fmt.Sprintf("XRANGE %s: %v", aggType, err))
		rr.mu.Unlock()
		return nil
	}
	out := make([]int64, 0, len(entries))
	for _, en := range entries {
		id, _ := strconv.ParseInt(fmt.Sprint(en.Values["id"]), 10, 64)
		out = append(out, id)
	}
	return out
}

func TestRoutingTwoDestinationsKeepAggregateOrderThroughAKill(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	// Aggregate k's events alternate between the two destinations, half of
	// the aggregates starting with each. One more aggregate carries an event
	// no route matches between two routed ones.
	rows, err := e.pool.Query(ctx, `
		INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'acct' || (g % $1::int), '1',
		       CASE WHEN ((g / $1::int) + (g % $1::int)) % 2 = 0 THEN 'acct.notify' ELSE 'acct.paid' END,
		       jsonb_build_object('n', g)
		FROM generate_series(0, $1::int * $2::int - 1) g ORDER BY g
		RETURNING id, aggregate_type, event_type`, routedAggregates, routedPerAgg)
	if err != nil {
		t.Fatal(err)
	}
	hooked, streamed := map[int64]bool{}, map[string][]int64{}
	for rows.Next() {
		var id int64
		var at, et string
		if err := rows.Scan(&id, &at, &et); err != nil {
			t.Fatal(err)
		}
		if et == "acct.notify" {
			hooked[id] = true
		} else {
			streamed[at] = append(streamed[at], id)
		}
	}
	if rows.Err() != nil || len(hooked) != routedAggregates*routedPerAgg/2 {
		t.Fatalf("inserted %d webhook-bound rows (%v)", len(hooked), rows.Err())
	}
	var stray []int64
	for _, et := range []string{"stray.paid", "stray.unknown", "stray.notify"} {
		var id int64
		if err := e.pool.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
			VALUES ('stray', '1', $1, '{}') RETURNING id`, et).Scan(&id); err != nil {
			t.Fatal(err)
		}
		stray = append(stray, id)
	}
	streamed["stray"] = []int64{stray[0]}

	rr := &routedReceiver{t: t, rdb: e.rdb, prefix: e.prefix, streamed: streamed, seen: map[int64]int{},
		first: map[string][]int64{}, holding: make(chan struct{}), release: make(chan struct{})}
	srv := httptest.NewServer(rr)
	t.Cleanup(srv.Close)
	t.Cleanup(func() {
		select {
		case <-rr.release:
		default:
			close(rr.release)
		}
	})
	cfg := filepath.Join(t.TempDir(), "routing.yaml")
	if err := os.WriteFile(cfg, []byte(`
dispatch:
  destinations:
    hook:
      sink: webhook
      webhook: {url: "`+srv.URL+`/events", timeout: 1s}
    stream:
      sink: redis_stream
      redis_stream: {stream: "routed.{aggregate_type}", maxlen: 0}
  routes:
    - {event_type: "*.notify", to: hook}
    - {event_type: "*.paid", to: stream}
`), 0o600); err != nil {
		t.Fatal(err)
	}

	first := e.start("--config", cfg)
	e.set("OUTBOXD_HTTP_ADDR", freeAddr(t))
	second := e.start("--config", cfg)
	select {
	case <-rr.holding:
	case <-time.After(2 * time.Minute):
		t.Fatalf("the webhook got %d of %d requests before the hold; first replica's logs:\n%s", rr.count(), routedHoldAfter, first.tail(20))
	}
	// Kill the one that leads now (the first, unless it lost its lease).
	leader, standby := first, second
	if leads(t, second) {
		leader, standby = second, first
	}
	leader.kill() // mid-run: requests held at the webhook, stream writes done
	close(rr.release)

	testkit.WaitFor(t, 3*time.Minute, "every row settled after the kill", func() bool {
		return e.count("dispatched_at IS NULL AND dead_at IS NULL") == 0
	}, e.describeRows("dispatched_at IS NULL AND dead_at IS NULL LIMIT 20"))

	// Nothing lost: each destination has every one of its events, and only those.
	if n := e.count("dead_at IS NOT NULL"); n != 1 {
		t.Errorf("%d dead rows, want only the unrouted one: %v", n, e.rows("dead_at IS NOT NULL LIMIT 5"))
	}
	if w := e.row(stray[1]); !w.Dead || w.LastError != "no route" || w.Attempts != 0 && w.Attempts != 1 {
		t.Errorf("the unrouted row: %s, want dead with last_error \"no route\"", w)
	}
	rr.mu.Lock()
	defer rr.mu.Unlock()
	for _, v := range rr.violations[:min(len(rr.violations), 20)] {
		t.Error(v)
	}
	missing := 0
	for id := range hooked {
		if rr.seen[id] == 0 {
			missing++
		}
	}
	if missing > 0 || rr.seen[stray[2]] == 0 {
		t.Errorf("the webhook lacks %d of its %d events (stray's: %d arrivals)", missing, len(hooked), rr.seen[stray[2]])
	}
	dups := 0
	for aggType, want := range streamed {
		ids := rr.streamIDs(ctx, aggType)
		var firsts []int64
		seen := map[int64]bool{}
		for _, id := range ids {
			if seen[id] {
				dups++
				continue
			}
			seen[id] = true
			firsts = append(firsts, id)
		}
		if !slices.Equal(firsts, want) {
			t.Errorf("stream %s holds %v (first appearances), want exactly its events in id order %v", aggType, firsts, want)
		}
	}
	for aggType, ids := range rr.first {
		if !slices.IsSorted(ids) {
			t.Errorf("%s: the webhook's first arrivals are out of id order: %v", aggType, ids)
		}
	}
	redelivered := 0
	for _, n := range rr.seen {
		if n > 1 {
			redelivered++
		}
	}
	t.Logf("webhook: %d events, %d delivered again after the kill; streams: %d duplicate entries", len(rr.seen), redelivered, dups)

	// The survivor's view: its sends by destination, and its destinations.
	_, body := httpGetText(t, "http://"+standby.addr+"/metrics")
	for _, d := range []string{"hook", "stream"} {
		if !strings.Contains(body, `outboxd_dispatched_total{destination="`+d+`"}`) {
			t.Errorf("the standby's /metrics lacks outboxd_dispatched_total for %s", d)
		}
	}
	_, status := httpGetText(t, "http://"+standby.addr+"/status")
	var st struct {
		Destinations []struct{ Name, Sink, Ordering string } `json:"destinations"`
	}
	if err := json.Unmarshal([]byte(status), &st); err != nil || len(st.Destinations) != 2 ||
		st.Destinations[0].Name != "hook" || st.Destinations[0].Sink != "webhook" ||
		st.Destinations[1].Name != "stream" || st.Destinations[1].Sink != "redis_stream" || st.Destinations[1].Ordering == "" {
		t.Errorf("/status destinations: %v %s", err, trunc(status, 800))
	}
}

// leads reports whether r's /status says it holds lock:outbox:poller.
func leads(t *testing.T, r *replica) bool {
	t.Helper()
	_, body := httpGetText(t, "http://"+r.addr+"/status")
	var st struct {
		Locks []struct {
			Name     string `json:"name"`
			HeldByMe bool   `json:"held_by_this_replica"`
		} `json:"locks"`
	}
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("/status: %v: %s", err, trunc(body, 300))
	}
	for _, l := range st.Locks {
		if l.Name == "lock:outbox:poller" {
			return l.HeldByMe
		}
	}
	return false
}

func (rr *routedReceiver) count() int {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	return rr.arrivals
}

func httpGetText(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}
