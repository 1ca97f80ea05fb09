package blackbox

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/internal/testenv"
)

// Black-box tests of dispatch.sink=kafka: the built binary produces to
// kfake, franz-go's fake Kafka cluster, run inside this test process on a
// fixed loopback port; the test reads the topics back with a consumer.

// kafkaCluster starts kfake on 127.0.0.1:<free port> with topics of 3
// partitions each (no auto-creation), closed at cleanup, after the
// replicas started later have stopped.
func kafkaCluster(t *testing.T, topics ...string) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(testenv.FreePort(t)), kfake.SeedTopics(3, topics...))
	if err != nil {
		t.Fatalf("start kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// kafkaEnv is a testBundle whose replica relays to c with the default topic
// template (outbox.event.{aggregate_type}). The lease is longer than the
// suite's 2 s, so the sink's own answers (about a second to call a topic
// missing) come before the lease's trust deadline.
func kafkaEnv(t *testing.T, c *kfake.Cluster) *testBundle {
	e := setup(t)
	e.set("OUTBOXD_DISPATCH_SINK", "kafka",
		"OUTBOXD_DISPATCH_KAFKA_BROKERS", strings.Join(c.ListenAddrs(), ","),
		"OUTBOXD_POLLER_LOCK_TTL", "10s")
	return e
}

// kafkaRecords reads every record of topic from the start until there are
// at least n, in each partition's order.
func kafkaRecords(t *testing.T, c *kfake.Cluster, topic string, n int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	var out []*kgo.Record
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of at least %d records from %s", len(out), n, topic)
		}
		fs.EachError(func(tp string, p int32, err error) { t.Fatalf("fetch %s/%d: %v", tp, p, err) })
		out = append(out, fs.Records()...)
	}
	return out
}

// kafkaHeaders are a record's headers by name; a name twice is an error.
func kafkaHeaders(t *testing.T, r *kgo.Record) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, h := range r.Headers {
		if _, dup := out[h.Key]; dup {
			t.Errorf("record %s/%d@%d has header %s twice", r.Topic, r.Partition, r.Offset, h.Key)
		}
		out[h.Key] = string(h.Value)
	}
	return out
}

// kafkaDelivered turns records into what checkContract reads: the headers,
// the record key as the ordering key, the value as the body.
func kafkaDelivered(t *testing.T, recs []*kgo.Record) []delivered {
	t.Helper()
	out := make([]delivered, len(recs))
	for i, r := range recs {
		out[i] = delivered{where: fmt.Sprintf("record %s/%d@%d", r.Topic, r.Partition, r.Offset),
			headers: kafkaHeaders(t, r), key: string(r.Key), body: string(r.Value)}
	}
	return out
}

// kafkaCase: the default topic template, CloudEvents on (ce_), and each
// aggregate's records in one partition.
func kafkaCase() sinkCase {
	const topic = "outbox.event.order"
	var recs []*kgo.Record
	return sinkCase{
		name: "kafka", cePrefix: "ce_",
		setup: func(t *testing.T) (*testBundle, func(int) []delivered) {
			c := kafkaCluster(t, topic)
			return kafkaEnv(t, c), func(n int) []delivered {
				recs = kafkaRecords(t, c, topic, n)
				return kafkaDelivered(t, recs)
			}
		},
		check: func(t *testing.T, _ *replica, _ []delivered) {
			partition := map[string]int32{}
			for _, r := range recs {
				if p, ok := partition[string(r.Key)]; ok && p != r.Partition {
					t.Errorf("aggregate %s in partitions %d and %d", r.Key, p, r.Partition)
				}
				partition[string(r.Key)] = r.Partition
			}
		},
	}
}

// TestKafkaSinkUnknownTopic: rows whose topic does not exist are retried
// with a last_error that names the topic and says to create it, while the
// other aggregates flow; once the topic is created they go through, each
// aggregate in order.
func TestKafkaSinkUnknownTopic(t *testing.T) {
	t.Parallel()
	c := kafkaCluster(t, "outbox.event.order")
	e := kafkaEnv(t, c).set("OUTBOXD_POLLER_MAX_ATTEMPTS", "1000")
	var missing []int64
	for i := range 6 {
		missing = append(missing, e.insert("missing", strconv.Itoa(i%2), `{"m":`+strconv.Itoa(i)+`}`, ""))
	}
	flowing := e.insertMany("order", 5, 4)
	e.start()
	waitFor(t, "the other aggregates' rows dispatched", func() bool {
		return e.count("aggregate_type = 'order' AND dispatched_at IS NOT NULL") == len(flowing)
	}, e.describeRows("aggregate_type = 'order'"))
	waitFor(t, "the rows without a topic retried, saying so", func() bool {
		return e.count(`aggregate_type = 'missing' AND attempts >= 2 AND last_error LIKE '%does not exist%'`) >= 2
	}, e.describeRows("aggregate_type = 'missing'"))
	for _, w := range e.rows("aggregate_type = 'missing'") {
		if w.Dispatched || w.Dead {
			t.Fatalf("row without a topic settled: %s", w)
		}
		if w.Attempts > 0 && (!strings.Contains(w.LastError, `topic "outbox.event.missing"`) || !strings.Contains(w.LastError, "create it")) {
			t.Errorf("last_error does not name the topic and the fix: %s", w)
		}
	}
	t.Logf("last_error: %s", e.rows("aggregate_type = 'missing' AND attempts > 0")[0].LastError)

	if err := c.CreateTopic("outbox.event.missing", 2, nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the rows dispatched once the topic exists", func() bool {
		return e.count("aggregate_type = 'missing' AND dispatched_at IS NOT NULL") == len(missing)
	}, e.describeRows("aggregate_type = 'missing'"))
	order, _ := checkContract(t, kafkaDelivered(t, kafkaRecords(t, c, "outbox.event.missing", len(missing))), "missing", e.payloads("true"), "")
	want := map[string][]int64{"0": {missing[0], missing[2], missing[4]}, "1": {missing[1], missing[3], missing[5]}}
	if fmt.Sprint(order) != fmt.Sprint(want) {
		t.Errorf("topic holds per aggregate %v, want %v", order, want)
	}
}
