package blackbox

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/outboxd/outboxd/internal/testenv"
)

// Black-box tests of dispatch.sink=sqs and sns: the built binary sends to
// moto_server, an emulator of AWS started per test on a loopback port
// (internal/testenv.StartMoto); the test reads the queue back (for SNS, a
// queue subscribed to the topic with raw message delivery). Verified
// against the emulator only, never against AWS.

// awsEnv is a testBundle whose replica reaches m with the AWS SDK's default
// chain (environment credentials, no instance metadata), and a lease
// longer than the suite's 2 s, so an emulator slowed by a loaded machine
// answers before the lease's trust deadline.
func awsEnv(t *testing.T, m *testenv.Moto, kv ...string) *testBundle {
	e := setup(t)
	for _, v := range m.Env() {
		k, val, _ := strings.Cut(v, "=")
		e.set(k, val)
	}
	return e.set("OUTBOXD_POLLER_LOCK_TTL", "10s").set(kv...)
}

// sqsEnv relays to the queue at url.
func sqsEnv(t *testing.T, m *testenv.Moto, url string) *testBundle {
	return awsEnv(t, m, "OUTBOXD_DISPATCH_SINK", "sqs", "OUTBOXD_DISPATCH_SQS_QUEUE_URL", url, "OUTBOXD_DISPATCH_SQS_ENDPOINT", m.Endpoint)
}

// awsDelivered turns messages into what checkContract reads: the
// attributes, with those packed into outboxd-headers unpacked, the
// aggregate_id attribute as the key (the message group is checked apart),
// the body.
func awsDelivered(t *testing.T, msgs []types.Message) []delivered {
	t.Helper()
	out := make([]delivered, len(msgs))
	for i, m := range msgs {
		h := map[string]string{}
		for k, v := range m.MessageAttributes {
			h[k] = aws.ToString(v.StringValue)
		}
		if packed, ok := h["outboxd-headers"]; ok {
			var more map[string]string
			if err := json.Unmarshal([]byte(packed), &more); err != nil {
				t.Fatalf("message %s: outboxd-headers %q: %v", aws.ToString(m.MessageId), packed, err)
			}
			for k, v := range more {
				if _, dup := h[k]; dup {
					t.Errorf("message %s: %s both an attribute and packed", aws.ToString(m.MessageId), k)
				}
				h[k] = v
			}
			delete(h, "outboxd-headers")
		}
		out[i] = delivered{where: "message " + aws.ToString(m.MessageId), headers: h, key: h["aggregate_id"], body: aws.ToString(m.Body)}
	}
	return out
}

// awsCase is a TestSinks case for a standard queue that the replica fills
// (sqs) or that a standard topic it publishes to fills (sns), CloudEvents
// on, so a message has 11 headers and the last two are packed. A standard
// queue keeps no order in AWS; moto's keeps the order it was given, so the
// suite's order check sees the order the sink sent in. FIFO groups are
// checked by TestSQSSinkMissingQueue and the sinks' own tests (moto's FIFO
// queues slow down as they fill: 0.1 s to 0.6 s a call by 60 messages on
// this machine, too slow for the suite's 200).
func awsCase(name string) sinkCase {
	return sinkCase{
		name: name, cePrefix: "ce-",
		setup: func(t *testing.T) (*testBundle, func(int) []delivered) {
			m := testenv.StartMoto(t)
			url := m.CreateQueue(t, "outbox", nil)
			e := sqsEnv(t, m, url)
			if name == "sns" {
				e = awsEnv(t, m, "OUTBOXD_DISPATCH_SINK", "sns", "OUTBOXD_DISPATCH_SNS_TOPIC_ARN", m.CreateTopic(t, "outbox", url),
					"OUTBOXD_DISPATCH_SNS_ENDPOINT", m.Endpoint)
			}
			return e, func(n int) []delivered { return awsDelivered(t, m.Receive(t, url, n)) }
		},
	}
}

// TestSQSSinkMissingQueue: while the FIFO queue does not exist every row
// is retried (a missing queue fails them all) with a last_error that names
// the queue and says to create it, none dead; once it is created they all
// go through, each in the message group order/<aggregate_id> with its id
// as the deduplication id, each group in id order.
func TestSQSSinkMissingQueue(t *testing.T) {
	t.Parallel()
	m := testenv.StartMoto(t)
	url := m.QueueURL("late.fifo")
	e := sqsEnv(t, m, url).set("OUTBOXD_POLLER_MAX_ATTEMPTS", "1000")
	ids := e.insertMany("order", 4, 3)
	e.start()
	waitFor(t, "the rows retried, saying the queue does not exist", func() bool {
		return e.count(`attempts >= 2 AND last_error LIKE '%does not exist%'`) >= 4
	}, e.describeRows("true"))
	for _, w := range e.rows("true") {
		if w.settled() {
			t.Fatalf("row settled without a queue: %s", w)
		}
		if w.Attempts > 0 && (!strings.Contains(w.LastError, strconv.Quote(url)) || !strings.Contains(w.LastError, "create it")) {
			t.Errorf("last_error does not name the queue and the fix: %s", w)
		}
	}
	t.Logf("last_error: %s", e.rows("attempts > 0")[0].LastError)

	m.CreateQueue(t, "late.fifo", nil)
	waitFor(t, "every row dispatched once the queue exists", func() bool {
		return e.count("dispatched_at IS NOT NULL") == len(ids)
	}, e.describeRows("dispatched_at IS NULL"))
	msgs := m.Receive(t, url, len(ids))
	order, seen := checkContract(t, awsDelivered(t, msgs), "order", e.payloads("true"), "")
	consumedOnce(t, ids, seen, "the queue")
	want := map[string][]int64{}
	for _, w := range e.rows("true") {
		want[strings.TrimPrefix(w.Agg, "order/")] = append(want[strings.TrimPrefix(w.Agg, "order/")], w.ID)
	}
	if fmt.Sprint(order) != fmt.Sprint(want) {
		t.Errorf("groups hold %v, want %v", order, want)
	}
	for _, msg := range msgs {
		id, agg := aws.ToString(msg.MessageAttributes["id"].StringValue), aws.ToString(msg.MessageAttributes["aggregate_id"].StringValue)
		if g, d := msg.Attributes["MessageGroupId"], msg.Attributes["MessageDeduplicationId"]; g != "order/"+agg || d != e.dedupeID(id) {
			t.Errorf("event %s: group %q deduplication id %q, want order/%s and %s", id, g, d, agg, e.dedupeID(id))
		}
	}
}

// TestSQSSinkOversizeMessage: a queue that takes messages of 1 KiB; a row
// of 2 KiB is dead-lettered at once with the queue's reason in last_error,
// its aggregate's next row and every other aggregate's rows go through.
func TestSQSSinkOversizeMessage(t *testing.T) {
	t.Parallel()
	m := testenv.StartMoto(t)
	url := m.CreateQueue(t, "small", map[string]string{"MaximumMessageSize": "1024"})
	e := sqsEnv(t, m, url)
	big := e.insert("order", "big", `{"x":"`+strings.Repeat("x", 2048)+`"}`, "")
	after := e.insert("order", "big", `{"after":1}`, "")
	others := e.insertMany("order", 5, 2)
	e.start()
	waitFor(t, "the big row dead and the rest dispatched", func() bool {
		return e.count("dead_at IS NOT NULL") == 1 && e.count("dispatched_at IS NOT NULL") == len(others)+1
	}, e.describeRows("true"))
	w := e.row(big)
	if !w.Dead || w.Attempts != 1 || !strings.Contains(w.LastError, "shorter than") || !strings.Contains(w.LastError, "replay") {
		t.Errorf("big row: %s; want dead after one attempt, the queue's reason and the fix", w)
	}
	t.Logf("last_error: %s", w.LastError)
	if !e.row(after).Dispatched {
		t.Errorf("the big row's aggregate is held: %s", e.row(after))
	}
	_, seen := checkContract(t, awsDelivered(t, m.Receive(t, url, len(others)+1)), "order", e.payloads("true"), "")
	consumedOnce(t, append(others, after), seen, "the queue")
	if seen[big] != 0 {
		t.Errorf("the big row reached the queue")
	}
}

// TestSNSSinkMissingTopic: rows are retried while the topic does not
// exist, with a last_error naming it; created, they go through. The relay
// is stopped while the topic and the queue's subscription are made: SNS
// accepts a message for a topic that has no subscription yet and drops it,
// so a retry landing between the two would be delivered to no queue.
func TestSNSSinkMissingTopic(t *testing.T) {
	t.Parallel()
	m := testenv.StartMoto(t)
	url := m.CreateQueue(t, "sub", nil)
	e := awsEnv(t, m, "OUTBOXD_DISPATCH_SINK", "sns", "OUTBOXD_DISPATCH_SNS_TOPIC_ARN", m.TopicARN("later"),
		"OUTBOXD_DISPATCH_SNS_ENDPOINT", m.Endpoint, "OUTBOXD_POLLER_MAX_ATTEMPTS", "1000")
	ids := e.insertMany("order", 3, 2)
	r := e.start()
	waitFor(t, "the rows retried, saying the topic does not exist", func() bool {
		return e.count(`attempts >= 2 AND last_error LIKE '%does not exist%' AND dead_at IS NULL`) >= 3
	}, e.describeRows("true"))
	if w := e.rows("attempts > 0")[0]; !strings.Contains(w.LastError, strconv.Quote(m.TopicARN("later"))) {
		t.Errorf("last_error does not name the topic: %s", w)
	}
	r.stop()
	m.CreateTopic(t, "later", url)
	e.start()
	waitFor(t, "every row dispatched once the topic exists", func() bool {
		return e.count("dispatched_at IS NOT NULL") == len(ids)
	}, e.describeRows("dispatched_at IS NULL"))
	_, seen := checkContract(t, awsDelivered(t, m.Receive(t, url, len(ids))), "order", e.payloads("true"), "")
	consumedOnce(t, ids, seen, "the subscribed queue")
}

// TestSQSSinkWithoutARegionExits2: a queue URL that names no region
// (an emulator's), no dispatch.sqs.region and none in the environment or
// the shared config: `run` exits 2 naming dispatch.sqs.region.
func TestSQSSinkWithoutARegionExits2(t *testing.T) {
	t.Parallel()
	m := testenv.StartMoto(t)
	e := sqsEnv(t, m, m.QueueURL("q")).set("AWS_REGION", "", "AWS_DEFAULT_REGION", "", "AWS_PROFILE", "",
		"AWS_CONFIG_FILE", "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
	res := runBinary(t, e.vars, 30*time.Second, "run")
	if res.code != 2 || !strings.Contains(res.stderr, "dispatch.sqs.region") {
		t.Errorf("want exit 2 naming dispatch.sqs.region; got %s", res)
	}
}
