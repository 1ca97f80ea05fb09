package sns

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/dispatch/internal/sinktest"
	"github.com/outboxd/outboxd/internal/cetest"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/internal/testkit"
)

// Tests against moto_server (internal/testenv.StartMoto), started per test:
// the sink publishes to a topic that an SQS queue subscribes to with raw
// message delivery, and the test reads that queue back.

// No Postgres or Redis here: plain TestMain, still leak-checked.
func TestMain(m *testing.M) { testkit.VerifyTestMain(m) }

// testBundle is a test's moto, a sink publishing to its topic (closed at
// cleanup) and the URL of the queue subscribed to that topic.
type testBundle struct {
	moto *testenv.Moto
	sink *Sink
	url  string
}

// setup starts moto with a topic named topic subscribed by a queue.
func setup(t *testing.T, topic string) testBundle {
	t.Helper()
	return setupCE(t, topic, dispatch.CloudEvents{})
}

// setupCE is setup with CloudEvents as ce says.
func setupCE(t *testing.T, topic string, ce dispatch.CloudEvents) testBundle {
	t.Helper()
	m := testenv.StartMoto(t)
	queue := "sub"
	if strings.HasSuffix(topic, ".fifo") {
		queue += ".fifo"
	}
	url := m.CreateQueue(t, queue, nil)
	arn := m.TopicARN(topic)
	if topic != "missing" {
		arn = m.CreateTopic(t, topic, url)
	}
	s, err := New(t.Context(), Config{TopicARN: arn, Endpoint: m.Endpoint, Log: testkit.Logger(t), CloudEvents: ce,
		Options: []func(*config.LoadOptions) error{config.WithCredentialsProvider(m.Credentials())}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return testBundle{moto: m, sink: s, url: url}
}

// publishEvents sends n events for each of aggs aggregates, interleaved, ids from
// 1, with payload(id) as the body.
func publishEvents(t *testing.T, s *Sink, aggs, n int, payload func(id int64) string) ([]dispatch.Event, []dispatch.Result) {
	var evs []dispatch.Event
	for range n {
		for a := range aggs {
			id := int64(len(evs) + 1)
			evs = append(evs, dispatch.Event{ID: id, AggregateType: "deal", AggregateID: strconv.Itoa(a), EventType: "deal.funded",
				Payload: json.RawMessage(payload(id)), Headers: json.RawMessage(`{}`), CreatedAt: time.Now()})
		}
	}
	return evs, s.Send(t.Context(), dispatch.Batch{Events: evs, Token: 3, Until: func() time.Time { return time.Now().Add(time.Minute) }})
}

func small(id int64) string { return fmt.Sprintf(`{"n":%d}`, id) }

// TestCloudEventsDecodeWithTheSDK: in both modes, every message published
// (read from the raw-delivery subscription) decodes with the CloudEvents
// SDK to its row's event, read as docs/sinks/sqs.md tells a consumer
// (attributes, then those packed in outboxd-headers; ce- names, structured
// when content-type is the event format).
func TestCloudEventsDecodeWithTheSDK(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{dispatch.CloudEventsBinary, dispatch.CloudEventsStructured} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setupCE(t, "ce", dispatch.CloudEvents{Enabled: true, Mode: mode})
			m, s, url := b.moto, b.sink, b.url
			evs, rs := publishEvents(t, s, 3, 2, small)
			for i, r := range rs {
				if r.Outcome != dispatch.Delivered {
					t.Fatalf("event %d: %v %v", evs[i].ID, r.Outcome, r.Err)
				}
			}
			for _, msg := range m.Receive(t, url, len(evs)) {
				own := map[string]string{}
				for k, v := range msg.MessageAttributes {
					own[k] = aws.ToString(v.StringValue)
				}
				a, err := sinktest.Unpacked(own)
				if err != nil {
					t.Fatal(err)
				}
				id, _ := strconv.Atoi(a["id"])
				if id < 1 || id > len(evs) {
					t.Fatalf("message attributes %v: no event id", a)
				}
				ce := cetest.Message{Prefix: "ce-", ContentType: a["content-type"], Headers: a, Body: []byte(aws.ToString(msg.Body))}
				if err := cetest.CheckEvent(ce, mode == dispatch.CloudEventsStructured, ceWant(evs[id-1])); err != nil {
					t.Errorf("event %d (body %s, attributes %v): %v", id, aws.ToString(msg.Body), a, err)
				}
			}
		})
	}
}

// TestFIFOTopicKeepsEachAggregateInOrder: 30 events over 5 aggregates are
// published; the subscribed FIFO queue holds each once with the payload as
// the body and the contract's attributes, and each aggregate's in id order.
func TestFIFOTopicKeepsEachAggregateInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, "deals.fifo")
	m, s, url := b.moto, b.sink, b.url
	evs, out := publishEvents(t, s, 5, 6, small)
	for i, r := range out {
		if r.Outcome != dispatch.Delivered || r.Ref == "" {
			t.Fatalf("event %d: %v %q (%v)", evs[i].ID, r.Outcome, r.Ref, r.Err)
		}
	}
	got := map[string][]int64{}
	for _, msg := range m.Receive(t, url, len(evs)) {
		a := map[string]string{}
		for k, v := range msg.MessageAttributes {
			a[k] = aws.ToString(v.StringValue)
		}
		id, err := strconv.ParseInt(a["id"], 10, 64)
		if err != nil || aws.ToString(msg.Body) != small(id) || a["aggregate_type"] != "deal" || a["event_type"] != "deal.funded" ||
			a["fencing_token"] != "3" || a["created_at"] == "" {
			t.Errorf("message %s: body %s attributes %v", aws.ToString(msg.MessageId), aws.ToString(msg.Body), a)
		}
		if g := msg.Attributes["MessageGroupId"]; g != "deal/"+a["aggregate_id"] {
			t.Errorf("event %d: group %q", id, g)
		}
		got[a["aggregate_id"]] = append(got[a["aggregate_id"]], id)
	}
	for agg, ids := range got {
		if len(ids) != 6 || !slices.IsSorted(ids) {
			t.Errorf("aggregate %s: %v, want its 6 ids in order", agg, ids)
		}
	}
	if len(got) != 5 {
		t.Errorf("%d aggregates read back, want 5", len(got))
	}
}

// TestFIFORewindWithinTheWindowIsDelivered: rows that reuse the ids of
// rows published a moment before (a sequence rewind, a re-import) have
// other deduplication ids, so the FIFO topic's subscribed FIFO queue gets
// every one of them inside the five-minute window; the same rows
// published twice arrive once.
func TestFIFORewindWithinTheWindowIsDelivered(t *testing.T) {
	t.Parallel()
	b := setup(t, "rewind.fifo")
	m, s, url := b.moto, b.sink, b.url
	first, second := sinktest.Generation("deal", 1), sinktest.Generation("deal", 2)
	for _, evs := range [][]dispatch.Event{first, second, second} {
		if got := sinktest.Outcomes(s.Send(t.Context(), sinktest.Batch(evs...))); !slices.Equal(got, []dispatch.Outcome{dispatch.Delivered, dispatch.Delivered, dispatch.Delivered}) {
			t.Fatalf("outcomes %v, want every event published", got)
		}
	}
	var bodies []string
	for _, msg := range m.Receive(t, url, len(first)+len(second)) {
		bodies = append(bodies, aws.ToString(msg.Body))
	}
	if want := sinktest.Payloads(first, second); !slices.Equal(slices.Sorted(slices.Values(bodies)), want) {
		t.Errorf("the subscription got %v, want each row of both generations: %v", bodies, want)
	}
	if n, err := m.Count(t.Context(), url); err != nil || n != 0 {
		t.Errorf("after reading both generations the subscription's queue still holds %d (%v): the repeat was not deduplicated", n, err)
	}
}

// TestOversizeMessageIsDeadLetteredAlone: a message above SNS's 256 KiB is
// Permanent, its aggregate's next event NotAttempted, the others published.
func TestOversizeMessageIsDeadLetteredAlone(t *testing.T) {
	t.Parallel()
	b := setup(t, "deals")
	m, s, url := b.moto, b.sink, b.url
	evs, out := publishEvents(t, s, 4, 2, func(id int64) string {
		if id == 2 {
			return `"` + strings.Repeat("x", 300*1024) + `"`
		}
		return small(id)
	})
	for i, r := range out {
		want := dispatch.Delivered
		switch evs[i].ID {
		case 2:
			want = dispatch.Permanent
		case 6: // aggregate 1's second
			want = dispatch.NotAttempted
		}
		if r.Outcome != want {
			t.Errorf("event %d: %v (%v), want %v", evs[i].ID, r.Outcome, r.Err, want)
		}
	}
	if err := out[1].Err; err == nil || !strings.Contains(err.Error(), "too long") || !strings.Contains(err.Error(), "event 2") {
		t.Errorf("last_error %v: want the service's reason and the event", err)
	}
	if got := len(m.Receive(t, url, 6)); got != 6 {
		t.Errorf("%d messages, want 6", got)
	}
}

// TestMissingTopicIsRetried: each aggregate's first event Retryable with
// an error that says the topic does not exist and names it.
func TestMissingTopicIsRetried(t *testing.T) {
	t.Parallel()
	b := setup(t, "missing")
	m, s := b.moto, b.sink
	evs, out := publishEvents(t, s, 2, 2, small)
	for i, r := range out {
		want := dispatch.Retryable
		if i >= 2 {
			want = dispatch.NotAttempted
		}
		if r.Outcome != want {
			t.Fatalf("event %d: %v (%v), want %v", evs[i].ID, r.Outcome, r.Err, want)
		}
	}
	if msg := out[0].Err.Error(); !strings.Contains(msg, "does not exist") || !strings.Contains(msg, strconv.Quote(m.TopicARN("missing"))) {
		t.Errorf("last_error %q: want it to say the topic does not exist and name it", msg)
	}
}

// TestBadTopicARNIsRefused: New says what is wrong with an ARN, and takes
// the region from a good one.
func TestBadTopicARNIsRefused(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ arn, want string }{
		{"", "empty topic ARN"},
		{"deals", "want arn:aws:sns"},
		{"arn:aws:sqs:us-east-1:123456789012:deals", "want arn:aws:sns"},
		{"arn:aws:sns:us-east-1:1234:deals", "12-digit account"},
	} {
		if _, err := New(t.Context(), Config{TopicARN: c.arn}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ARN %q: %v, want an error saying %q", c.arn, err, c.want)
		}
	}
	fifo, region, err := ParseTopicARN("arn:aws-cn:sns:cn-north-1:123456789012:deals.fifo")
	if err != nil || !fifo || region != "cn-north-1" {
		t.Errorf("FIFO ARN: fifo %v region %q err %v", fifo, region, err)
	}
}

// ceWant is ev's CloudEvent as outboxd maps a row (source outboxd).
func ceWant(ev dispatch.Event) cetest.Want {
	return cetest.Want{ID: ev.ID, Source: "outboxd", Type: ev.EventType, Time: ev.CreatedAt,
		AggregateType: ev.AggregateType, AggregateID: ev.AggregateID, Data: string(ev.Payload)}
}
