package blackbox

import (
	"slices"
	"strconv"
	"testing"
	"time"
)

// delivered is one message as a consumer of a sink reads it back.
type delivered struct {
	where   string            // e.g. "record t/0@12", for messages
	headers map[string]string // the contract's headers (and the row's own) by name
	key     string            // the ordering key as the broker carries it
	body    string
	// contentType is the protocol's content-type property where it is not
	// a header (AMQP's content_type).
	contentType string
}

// checkContract is the one check of the contract's mapping (docs/reference.md,
// "Headers per sink") for every broker sink: the headers id, aggregate_type,
// aggregate_id (= the ordering key), event_type, created_at (RFC 3339),
// fencing_token, the payload as the body, and, when cePrefix is set, the
// CloudEvents attributes. It returns, per aggregate_id, the ids in the order
// of their first appearance, and how many times each id appeared.
func checkContract(t *testing.T, msgs []delivered, aggType string, payloads map[int64]string, cePrefix string) (map[string][]int64, map[int64]int) {
	t.Helper()
	order := map[string][]int64{}
	seen := map[int64]int{}
	for _, m := range msgs {
		h := m.headers
		id, err := strconv.ParseInt(h["id"], 10, 64)
		if err != nil {
			t.Fatalf("%s: id header %q", m.where, h["id"])
		}
		if seen[id]++; seen[id] > 1 {
			continue // a redelivery: consumers dedupe on id
		}
		order[m.key] = append(order[m.key], id)
		if h["aggregate_type"] != aggType || h["event_type"] != "test.event" || h["aggregate_id"] == "" || h["aggregate_id"] != m.key {
			t.Errorf("%s: key %q, headers %v", m.where, m.key, h)
		}
		if _, err := time.Parse(time.RFC3339Nano, h["created_at"]); err != nil {
			t.Errorf("%s: created_at %q: %v", m.where, h["created_at"], err)
		}
		if tok, err := strconv.ParseInt(h["fencing_token"], 10, 64); err != nil || tok < 1 {
			t.Errorf("%s: fencing_token %q", m.where, h["fencing_token"])
		}
		if m.body != payloads[id] {
			t.Errorf("event %d: body %q, want the payload %q as is", id, m.body, payloads[id])
		}
		if cePrefix != "" && (h[cePrefix+"specversion"] != "1.0" || h[cePrefix+"id"] != h["id"] ||
			h[cePrefix+"type"] != "test.event" || h[cePrefix+"source"] != "outboxd") {
			t.Errorf("%s: CloudEvents attributes (%s*) missing or wrong: %v", m.where, cePrefix, h)
		}
	}
	return order, seen
}

// sinkCase is one broker sink in TestSinks.
type sinkCase struct {
	name string
	// setup returns an env relaying to the sink, and what reads back at
	// least n messages.
	setup func(t *testing.T) (e *testBundle, read func(n int) []delivered)
	// cePrefix: the case turns CloudEvents on and checks them with this
	// prefix; "" leaves them off.
	cePrefix string
	// check is what only this sink promises beyond the shared contract
	// (properties, subjects, partitions, log lines). May be nil.
	check func(t *testing.T, r *replica, msgs []delivered)
}

// TestSinks: for every broker sink, 200 events over 20 aggregates are all
// marked dispatched; each is read back from the broker at least once with
// the contract's headers and its payload as is (checkContract), and each
// aggregate's first appearances are in id order.
func TestSinks(t *testing.T) {
	t.Parallel()
	for _, c := range []sinkCase{kafkaCase(), natsCase(), rabbitMQCase(), redisStreamCase(), pubsubCase(), kinesisCase(), awsCase("sqs"), awsCase("sns")} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e, read := c.setup(t)
			if c.cePrefix != "" {
				e.set("OUTBOXD_DISPATCH_CLOUDEVENTS", "true")
			}
			ids := e.insertMany("order", 20, 10)
			r := e.start()
			waitFor(t, "all 200 rows dispatched", func() bool { return e.count("dispatched_at IS NOT NULL") == len(ids) },
				e.describeRows("dispatched_at IS NULL"))
			msgs := read(len(ids))
			order, seen := checkContract(t, msgs, "order", e.payloads("true"), c.cePrefix)
			for agg, got := range order {
				if !slices.IsSorted(got) {
					t.Errorf("aggregate %s: first appearances %v, want id order", agg, got)
				}
			}
			dups := consumedOnce(t, ids, seen, c.name)
			if len(order) != 20 {
				t.Errorf("%d aggregates read back, want 20", len(order))
			}
			if c.check != nil {
				c.check(t, r, msgs)
			}
			t.Logf("%d messages for %d events (%d delivered more than once)", len(msgs), len(ids), dups)
		})
	}
}
