package blackbox

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/internal/testenv"
)

// Black-box tests of dispatch.sink=kinesis: the built binary writes to
// kinesalite (npm), started by the test on a loopback port; the test reads
// the streams back shard by shard. They skip when npm cannot install
// kinesalite.

// kinesisEnv is an env whose replica writes to k with the default stream
// template (outbox.event.{aggregate_type}) and the static credentials
// kinesalite accepts.
func kinesisEnv(t *testing.T, k *testenv.Kinesalite) *env {
	e := newEnv(t)
	e.set("OUTBOXD_DISPATCH_SINK", "kinesis",
		"OUTBOXD_DISPATCH_KINESIS_REGION", "us-east-1",
		"OUTBOXD_DISPATCH_KINESIS_ENDPOINT", k.Endpoint,
		"AWS_ACCESS_KEY_ID", "test", "AWS_SECRET_ACCESS_KEY", "test", "AWS_EC2_METADATA_DISABLED", "true",
		"OUTBOXD_POLLER_LOCK_TTL", "10s")
	return e
}

// kinesisStream creates a stream of shards shards.
func kinesisStream(t *testing.T, k *testenv.Kinesalite, name string, shards int32) {
	t.Helper()
	if err := k.CreateStream(context.Background(), name, shards); err != nil {
		t.Fatalf("create stream %s: %v", name, err)
	}
}

// kinesisDelivered reads stream back as what checkContract reads: the
// envelope's headers, the partition key, the envelope's payload as the body.
func kinesisDelivered(t *testing.T, k *testenv.Kinesalite, stream string) []delivered {
	t.Helper()
	recs, err := k.Records(context.Background(), stream)
	if err != nil {
		t.Fatalf("read %s: %v", stream, err)
	}
	out := make([]delivered, len(recs))
	for i, r := range recs {
		var env struct {
			Headers map[string]string `json:"headers"`
			Payload json.RawMessage   `json:"payload"`
		}
		if err := json.Unmarshal(r.Data, &env); err != nil {
			t.Fatalf("record %s: data %q is not the envelope: %v", r.Sequence, r.Data, err)
		}
		key := r.PartitionKey
		if at := env.Headers["aggregate_type"] + "/"; strings.HasPrefix(key, at) {
			key = strings.TrimPrefix(key, at) // checkContract compares aggregate_id with the key
		} else {
			t.Errorf("record %s: partition key %q, want %s<aggregate_id>", r.Sequence, r.PartitionKey, at)
		}
		out[i] = delivered{where: "record " + r.Shard + "@" + r.Sequence, headers: env.Headers, key: key, body: string(env.Payload)}
	}
	return out
}

// kinesisCase: the default stream template over 2 shards, CloudEvents on
// (ce- in the envelope's headers).
func kinesisCase() sinkCase {
	return sinkCase{
		name: "kinesis", cePrefix: "ce-",
		setup: func(t *testing.T) (*env, func(int) []delivered) {
			k := testenv.StartKinesalite(t)
			kinesisStream(t, k, "outbox.event.order", 2)
			return kinesisEnv(t, k), func(int) []delivered { return kinesisDelivered(t, k, "outbox.event.order") }
		},
	}
}

// TestKinesisSinkFailures: rows whose stream does not exist are retried
// with a last_error naming it and saying to create it; a row above
// Kinesis' 1 MiB record is dead-lettered; the other aggregates flow
// meanwhile. Once the stream exists the retried rows go through, each
// aggregate in order.
func TestKinesisSinkFailures(t *testing.T) {
	t.Parallel()
	k := testenv.StartKinesalite(t)
	kinesisStream(t, k, "outbox.event.order", 1)
	e := kinesisEnv(t, k).set("OUTBOXD_POLLER_MAX_ATTEMPTS", "1000",
		"OUTBOXD_POLLER_MAX_PAYLOAD_BYTES", strconv.Itoa(2<<20), "OUTBOXD_POLLER_BATCH_MAX_BYTES", strconv.Itoa(8<<20))
	var missing []int64
	for i := range 6 {
		missing = append(missing, e.insert("missing", strconv.Itoa(i%2), `{"m":`+strconv.Itoa(i)+`}`, ""))
	}
	big := e.insert("order", "big", `"`+strings.Repeat("x", 1_100_000)+`"`, "")
	after := e.insert("order", "big", `{"after":1}`, "")
	flowing := e.insertMany("order", 5, 4)
	e.start()
	waitFor(t, "the other aggregates' rows dispatched", func() bool {
		return e.count("aggregate_type = 'order' AND aggregate_id <> 'big' AND dispatched_at IS NOT NULL") == len(flowing)
	}, e.describeRows("aggregate_type = 'order'"))
	waitFor(t, "the oversize row dead-lettered, the next of its aggregate dispatched", func() bool {
		return e.row(big).Dead && e.row(after).Dispatched
	}, e.describeRows("aggregate_id = 'big'"))
	if w := e.row(big); !strings.Contains(w.LastError, "Kinesis accepts") {
		t.Errorf("oversize row: %s", w)
	}
	waitFor(t, "the rows without a stream retried, saying so", func() bool {
		return e.count(`aggregate_type = 'missing' AND attempts >= 2 AND last_error LIKE '%does not exist%'`) >= 2
	}, e.describeRows("aggregate_type = 'missing'"))
	for _, w := range e.rows("aggregate_type = 'missing'") {
		if w.Dispatched || w.Dead {
			t.Fatalf("row without a stream settled: %s", w)
		}
		if w.Attempts > 0 && (!strings.Contains(w.LastError, `stream "outbox.event.missing"`) || !strings.Contains(w.LastError, "create it")) {
			t.Errorf("last_error does not name the stream and the fix: %s", w)
		}
	}
	t.Logf("last_error: %s", e.rows("aggregate_type = 'missing' AND attempts > 0")[0].LastError)
	t.Logf("oversize: %s", e.row(big).LastError)

	kinesisStream(t, k, "outbox.event.missing", 2)
	waitFor(t, "the rows dispatched once the stream exists", func() bool {
		return e.count("aggregate_type = 'missing' AND dispatched_at IS NOT NULL") == len(missing)
	}, e.describeRows("aggregate_type = 'missing'"))
	order, _ := checkContract(t, kinesisDelivered(t, k, "outbox.event.missing"), "missing", e.payloads("true"), "")
	want := map[string][]int64{"0": {missing[0], missing[2], missing[4]}, "1": {missing[1], missing[3], missing[5]}}
	if fmt.Sprint(order) != fmt.Sprint(want) {
		t.Errorf("stream holds per aggregate %v, want %v", order, want)
	}
}
