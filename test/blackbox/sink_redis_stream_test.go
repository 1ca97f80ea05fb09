package blackbox

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Black-box tests of dispatch.sink=redis_stream: the built binary appends
// rows to Redis streams (the test's own key prefix, so keys are
// <prefix>outbox.event.<aggregate_type>), read back with XRANGE.

// streamEntry is one entry's fields as Redis stores them.
type streamEntry struct {
	id     string
	fields map[string]string
}

// streamEntries reads every entry of key, in stream order.
func (e *env) streamEntries(key string) []streamEntry {
	e.t.Helper()
	raw, err := e.rdb.Do(context.Background(), "XRANGE", key, "-", "+").Slice()
	if err != nil {
		e.t.Fatalf("XRANGE %s: %v", key, err)
	}
	out := make([]streamEntry, len(raw))
	for i, r := range raw {
		pair := r.([]any)
		out[i] = streamEntry{id: pair[0].(string), fields: map[string]string{}}
		kv := pair[1].([]any)
		for j := 0; j+1 < len(kv); j += 2 {
			if _, dup := out[i].fields[kv[j].(string)]; dup {
				e.t.Errorf("entry %s of %s has field %s twice", out[i].id, key, kv[j])
			}
			out[i].fields[kv[j].(string)] = kv[j+1].(string)
		}
	}
	return out
}

// redisStreamEnv is an env whose replica relays to Redis streams.
func redisStreamEnv(t *testing.T) *env {
	e := newEnv(t)
	e.set("OUTBOXD_DISPATCH_SINK", "redis_stream",
		"OUTBOXD_DISPATCH_REDIS_STREAM_STREAM", "outbox.event.{aggregate_type}",
		"OUTBOXD_DISPATCH_REDIS_STREAM_MAXLEN", "100000")
	return e
}

// TestRedisStreamSink: 200 events over 20 aggregates are all marked
// dispatched, each is in the stream at least once with the contract's
// fields and its payload as is, and each aggregate's first appearances are
// in id order.
func TestRedisStreamSink(t *testing.T) {
	t.Parallel()
	e := redisStreamEnv(t)
	ids := e.insertMany("order", 20, 10)
	e.start()
	waitFor(t, "all 200 rows dispatched", func() bool { return e.count("dispatched_at IS NOT NULL") == len(ids) },
		e.describeRows("dispatched_at IS NULL"))

	key := e.prefix + "outbox.event.order"
	entries := e.streamEntries(key)
	payloads := e.payloads("true")
	seen := map[int64]int{}
	last := map[string]int64{} // aggregate_id -> last first-seen id
	for _, en := range entries {
		f := en.fields
		id, err := strconv.ParseInt(f["id"], 10, 64)
		if err != nil {
			t.Fatalf("entry %s: id field %q", en.id, f["id"])
		}
		seen[id]++
		if seen[id] > 1 {
			continue // a redelivery: consumers dedupe on id
		}
		if id < last[f["aggregate_id"]] {
			t.Errorf("aggregate %s: event %d first appears after %d", f["aggregate_id"], id, last[f["aggregate_id"]])
		}
		last[f["aggregate_id"]] = id
		if f["aggregate_type"] != "order" || f["event_type"] != "test.event" || f["aggregate_id"] == "" {
			t.Errorf("entry %s: fields %v", en.id, f)
		}
		if _, err := time.Parse(time.RFC3339Nano, f["created_at"]); err != nil {
			t.Errorf("entry %s: created_at %q: %v", en.id, f["created_at"], err)
		}
		if tok, err := strconv.ParseInt(f["fencing_token"], 10, 64); err != nil || tok < 1 {
			t.Errorf("entry %s: fencing_token %q", en.id, f["fencing_token"])
		}
		if f["payload"] != payloads[id] {
			t.Errorf("event %d: payload %q, want %q as is", id, f["payload"], payloads[id])
		}
	}
	dups := consumedOnce(t, ids, seen, "stream "+key)
	if len(last) != 20 {
		t.Errorf("%d aggregates in the stream, want 20", len(last))
	}
	t.Logf("%d entries for %d events (%d delivered more than once)", len(entries), len(ids), dups)
}

// TestRedisStreamSinkWrongType: a stream key holding a string fails only
// its aggregate type's rows, retried with a readable last_error naming the
// key; the other aggregates flow; once the key is removed the rows go
// through in order.
func TestRedisStreamSinkWrongType(t *testing.T) {
	t.Parallel()
	e := redisStreamEnv(t)
	e.set("OUTBOXD_POLLER_MAX_ATTEMPTS", "1000")
	blockedKey := e.prefix + "outbox.event.blocked"
	if err := e.rdb.Set(context.Background(), blockedKey, "not a stream", 0).Err(); err != nil {
		t.Fatal(err)
	}
	var blocked []int64
	for i := range 4 {
		blocked = append(blocked, e.insert("blocked", strconv.Itoa(i%2), `{"b":`+strconv.Itoa(i)+`}`, ""))
	}
	flowing := e.insertMany("order", 5, 4)
	e.start()
	waitFor(t, "the other aggregates' rows dispatched", func() bool {
		return e.count("aggregate_type = 'order' AND dispatched_at IS NOT NULL") == len(flowing)
	}, e.describeRows("aggregate_type = 'order'"))
	waitFor(t, "the blocked rows retried with a WRONGTYPE last_error", func() bool {
		return e.count(`aggregate_type = 'blocked' AND attempts >= 2 AND last_error LIKE '%WRONGTYPE%'`) >= 2
	}, e.describeRows("aggregate_type = 'blocked'"))
	for _, w := range e.rows("aggregate_type = 'blocked'") {
		if w.Dispatched || w.Dead {
			t.Fatalf("blocked row settled: %s", w)
		}
		if w.Attempts > 0 && !strings.Contains(w.LastError, strconv.Quote(blockedKey)) {
			t.Errorf("last_error does not name the key %s: %s", blockedKey, w)
		}
	}
	t.Logf("last_error: %s", e.rows("aggregate_type = 'blocked' AND attempts > 0")[0].LastError)

	if err := e.rdb.Del(context.Background(), blockedKey).Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the blocked rows dispatched once the key is gone", func() bool {
		return e.count("aggregate_type = 'blocked' AND dispatched_at IS NOT NULL") == len(blocked)
	}, e.describeRows("aggregate_type = 'blocked'"))
	var got []string
	for _, en := range e.streamEntries(blockedKey) {
		got = append(got, en.fields["aggregate_id"]+":"+en.fields["id"])
	}
	want := []string{
		fmt.Sprintf("0:%d", blocked[0]), fmt.Sprintf("1:%d", blocked[1]),
		fmt.Sprintf("0:%d", blocked[2]), fmt.Sprintf("1:%d", blocked[3]),
	}
	if perAgg(got) != perAgg(want) {
		t.Errorf("stream %s holds %v, want per aggregate %v", blockedKey, got, want)
	}
}

// perAgg renders "agg:id" items grouped by aggregate, order kept within each.
func perAgg(items []string) string {
	by := map[string][]string{}
	for _, it := range items {
		a, id, _ := strings.Cut(it, ":")
		by[a] = append(by[a], id)
	}
	return fmt.Sprint(by)
}
