package blackbox

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
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
func (e *testBundle) streamEntries(key string) []streamEntry {
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

// redisStreamEnv is a testBundle whose replica relays to Redis streams.
func redisStreamEnv(t *testing.T) *testBundle {
	e := setup(t)
	e.set("OUTBOXD_DISPATCH_SINK", "redis_stream",
		"OUTBOXD_DISPATCH_REDIS_STREAM_STREAM", "outbox.event.{aggregate_type}",
		"OUTBOXD_DISPATCH_REDIS_STREAM_MAXLEN", "100000")
	return e
}

// redisStreamCase: the stream <prefix>outbox.event.order, the payload as a
// field beside the headers.
func redisStreamCase() sinkCase {
	return sinkCase{
		name: "redis_stream",
		setup: func(t *testing.T) (*testBundle, func(int) []delivered) {
			e := redisStreamEnv(t)
			key := e.prefix + "outbox.event.order"
			return e, func(int) []delivered {
				var out []delivered
				for _, en := range e.streamEntries(key) {
					out = append(out, delivered{where: "entry " + en.id + " of " + key, headers: en.fields,
						key: en.fields["aggregate_id"], body: en.fields["payload"]})
				}
				return out
			}
		},
	}
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
