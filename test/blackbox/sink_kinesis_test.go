package blackbox

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/internal/testenv"
)

// Black-box tests of dispatch.sink=kinesis: the built binary writes to
// kinesalite (npm), started by the test on a loopback port; the test reads
// the streams back shard by shard. They fail when kinesalite cannot be had.

// kinesisEnv is a testBundle whose replica writes to k with the default stream
// template (outbox.event.{aggregate_type}) and the static credentials
// kinesalite accepts.
func kinesisEnv(t *testing.T, k *testenv.Kinesalite) *testBundle {
	e := setup(t)
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
		setup: func(t *testing.T) (*testBundle, func(int) []delivered) {
			k := testenv.StartKinesalite(t)
			kinesisStream(t, k, "outbox.event.order", 2)
			return kinesisEnv(t, k), func(int) []delivered { return kinesisDelivered(t, k, "outbox.event.order") }
		},
	}
}

// TestKinesisSinkFailures: a missing stream and a record above 1 MiB
// (checkFailures).
func TestKinesisSinkFailures(t *testing.T) {
	t.Parallel()
	k := testenv.StartKinesalite(t)
	kinesisStream(t, k, "outbox.event.order", 1)
	checkFailures(t, failureCase{
		e: kinesisEnv(t, k).set("OUTBOXD_POLLER_MAX_PAYLOAD_BYTES", strconv.Itoa(2<<20),
			"OUTBOXD_POLLER_BATCH_MAX_BYTES", strconv.Itoa(8<<20)),
		kind:     "stream",
		oversize: `"` + strings.Repeat("x", 1_100_000) + `"`, tooLarge: "Kinesis accepts 1048576",
		create: func() { kinesisStream(t, k, "outbox.event.missing", 2) },
		read:   func() []delivered { return kinesisDelivered(t, k, "outbox.event.missing") },
	})
}
