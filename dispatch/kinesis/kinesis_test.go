package kinesis

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/dispatch/internal/sinktest"
	"github.com/outboxd/outboxd/internal/cetest"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/internal/testkit"
)

// Tests run against kinesalite (npm), started per test on a loopback port
// (internal/testenv); they fail when it cannot be had.

func TestMain(m *testing.M) { testkit.VerifyTestMain(m) }

// newSink is a Sink on k with cfg's other fields.
func newSink(t testing.TB, k *testenv.Kinesalite, cfg Config) *Sink {
	t.Helper()
	cfg.Region, cfg.Endpoint = "us-east-1", k.Endpoint
	cfg.Log = slog.New(slog.NewJSONHandler(io.MultiWriter(testkit.Writer(t)), &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg.awsOpts = []func(*awsconfig.LoadOptions) error{
		awsconfig.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("test", "test", "")),
	}
	s, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}

// callLog is the sink's HTTP client, keeping each PutRecords call's
// partition keys.
type callLog struct {
	mu   sync.Mutex
	keys [][]string
}

func (c *callLog) Do(r *http.Request) (*http.Response, error) {
	if strings.HasSuffix(r.Header.Get("X-Amz-Target"), ".PutRecords") {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return nil, err
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		var in struct {
			Records []struct{ PartitionKey string }
		}
		if err := json.Unmarshal(body, &in); err != nil {
			return nil, err
		}
		var keys []string
		for _, rec := range in.Records {
			keys = append(keys, rec.PartitionKey)
		}
		c.mu.Lock()
		c.keys = append(c.keys, keys)
		c.mu.Unlock()
	}
	return http.DefaultClient.Do(r)
}

func createStream(t testing.TB, k *testenv.Kinesalite, name string, shards int32) {
	t.Helper()
	if err := k.CreateStream(context.Background(), name, shards); err != nil {
		t.Fatalf("create stream %s: %v", name, err)
	}
}

// read returns the stream's records as their envelopes, per shard in order.
func read(t *testing.T, k *testenv.Kinesalite, stream string) []readRecord {
	t.Helper()
	recs, err := k.Records(context.Background(), stream)
	if err != nil {
		t.Fatalf("read %s: %v", stream, err)
	}
	out := make([]readRecord, len(recs))
	for i, r := range recs {
		out[i].KinesisRecord = r
		if err := json.Unmarshal(r.Data, &out[i].env); err != nil {
			t.Fatalf("record %s: data %q is not the envelope: %v", r.Sequence, r.Data, err)
		}
	}
	return out
}

type readRecord struct {
	testenv.KinesisRecord
	env struct {
		Headers map[string]string `json:"headers"`
		Payload json.RawMessage   `json:"payload"`
	}
}

// TestWritesTheEnvelopeInOrder: 1,200 events over 7 aggregates (more
// than one PutRecords call per round, several rounds) are all Delivered
// and read back once each: the envelope carries the contract's headers and
// the payload as is, the partition key is the aggregate, and each
// aggregate's records are in id order within its shard.
func TestWritesTheEnvelopeInOrder(t *testing.T) {
	t.Parallel()
	k := testenv.StartKinesalite(t)
	createStream(t, k, "outbox.event.order", 3)
	calls := &callLog{}
	s := newSink(t, k, Config{CloudEvents: dispatch.CloudEvents{Enabled: true}, http: calls})
	var evs []dispatch.Event
	for i := range 1200 {
		agg := strconv.Itoa(i % 7)
		if i < 600 {
			agg = "wide-" + strconv.Itoa(i) // 600 aggregates of one event: two calls in round 0
		}
		evs = append(evs, sinktest.Event(int64(i+1), "order", agg))
	}
	for i, r := range s.Send(context.Background(), sinktest.Batch(evs...)) {
		if r.Outcome != dispatch.Delivered || !strings.HasPrefix(r.Ref, "outbox.event.order/shardId-") {
			t.Fatalf("event %d: %v %q %v", evs[i].ID, r.Outcome, r.Ref, r.Err)
		}
	}
	// PutRecords goes on past a failed record: a call holding two events
	// of one aggregate could write the second after the first failed.
	// 600 single-event aggregates and 7 of 600/7 events each: two calls
	// for round 0, then one per round.
	if n := len(calls.keys); n != 2+600/7 {
		t.Errorf("%d PutRecords calls, want %d", n, 2+600/7)
	}
	for i, keys := range calls.keys {
		if len(keys) > maxRecords {
			t.Errorf("call %d: %d records", i, len(keys))
		}
		seen := map[string]bool{}
		for _, key := range keys {
			if seen[key] {
				t.Errorf("call %d holds two records of partition key %s", i, key)
			}
			seen[key] = true
		}
	}
	recs := read(t, k, "outbox.event.order")
	if len(recs) != len(evs) {
		t.Fatalf("stream holds %d records, want %d", len(recs), len(evs))
	}
	perKey := map[string][]int64{}
	shardOf := map[string]string{}
	for _, r := range recs {
		h := r.env.Headers
		id, err := strconv.ParseInt(h["id"], 10, 64)
		if err != nil {
			t.Fatalf("record %s: id %q", r.Sequence, h["id"])
		}
		ev := evs[id-1]
		want := sinktest.Headers(ev, "ce-")
		want["ce-datacontenttype"] = "application/json"
		if fmt.Sprint(h) != fmt.Sprint(want) {
			t.Errorf("record %s: headers %v, want %v", r.Sequence, h, want)
		}
		if string(r.env.Payload) != string(ev.Payload) {
			t.Errorf("record %s: payload %s, want %s as is", r.Sequence, r.env.Payload, ev.Payload)
		}
		if r.PartitionKey != "order/"+ev.AggregateID {
			t.Errorf("record %s: partition key %q", r.Sequence, r.PartitionKey)
		}
		if sh, ok := shardOf[r.PartitionKey]; ok && sh != r.Shard {
			t.Errorf("partition key %s in shards %s and %s", r.PartitionKey, sh, r.Shard)
		}
		shardOf[r.PartitionKey] = r.Shard
		perKey[r.PartitionKey] = append(perKey[r.PartitionKey], id)
	}
	for key, ids := range perKey {
		if !slices.IsSorted(ids) {
			t.Errorf("partition key %s: %v, want id order", key, ids)
		}
	}
}

// TestCloudEventsDecodeWithTheSDK: in both modes, every record the stream
// holds decodes with the CloudEvents SDK to its row's event, read as
// outboxd's Kinesis binding says (docs/sinks/kinesis.md): binary, the
// envelope's ce- headers (ce-datacontenttype) and payload; structured, the
// record's data is the event in the JSON event format, nothing else.
func TestCloudEventsDecodeWithTheSDK(t *testing.T) {
	t.Parallel()
	k := testenv.StartKinesalite(t)
	for _, mode := range []string{dispatch.CloudEventsBinary, dispatch.CloudEventsStructured} {
		stream := "outbox.event." + mode
		createStream(t, k, stream, 1)
		s := newSink(t, k, Config{Stream: stream, CloudEvents: dispatch.CloudEvents{Enabled: true, Mode: mode}})
		evs := []dispatch.Event{sinktest.Event(1, "order", "1"), sinktest.Event(2, "order", `42 "x" 100% €`), sinktest.Event(3, "order", "1")}
		for i, r := range s.Send(context.Background(), sinktest.Batch(evs...)) {
			if r.Outcome != dispatch.Delivered {
				t.Fatalf("%s: event %d: %v %v", mode, evs[i].ID, r.Outcome, r.Err)
			}
		}
		recs, err := k.Records(context.Background(), stream)
		if err != nil || len(recs) != len(evs) {
			t.Fatalf("%s: read %d records (%v), want %d", mode, len(recs), err, len(evs))
		}
		for _, r := range recs {
			var rec struct { // the event (structured) or the envelope (binary)
				ID      string            `json:"id"`
				Headers map[string]string `json:"headers"`
				Payload json.RawMessage   `json:"payload"`
			}
			if err := json.Unmarshal(r.Data, &rec); err != nil {
				t.Fatalf("%s: record %s: %q is not JSON: %v", mode, r.Sequence, r.Data, err)
			}
			msg, id := cetest.Message{ContentType: "application/cloudevents+json", Body: r.Data}, rec.ID
			if mode == dispatch.CloudEventsBinary {
				msg, id = cetest.Message{Prefix: "ce-", Headers: rec.Headers, Body: rec.Payload}, rec.Headers["id"]
			}
			n, _ := strconv.Atoi(id)
			if n < 1 || n > len(evs) {
				t.Fatalf("%s: record %s: no event id in %s", mode, r.Sequence, r.Data)
			}
			if err := cetest.CheckEvent(msg, mode == dispatch.CloudEventsStructured, ceWant(evs[n-1])); err != nil {
				t.Errorf("%s: record %s (%s): %v", mode, r.Sequence, r.Data, err)
			}
		}
	}
}

// TestMissingStreamIsRetried: events for a stream that does not exist are
// Retryable with an error naming it, their aggregate's later events
// NotAttempted, other streams' events Delivered; once the stream exists
// they go through.
func TestMissingStreamIsRetried(t *testing.T) {
	t.Parallel()
	k := testenv.StartKinesalite(t)
	createStream(t, k, "outbox.event.order", 1)
	s := newSink(t, k, Config{})
	evs := []dispatch.Event{sinktest.Event(1, "missing", "a"), sinktest.Event(2, "order", "a"), sinktest.Event(3, "missing", "a"), sinktest.Event(4, "missing", "b")}
	rs := s.Send(context.Background(), sinktest.Batch(evs...))
	want := []dispatch.Outcome{dispatch.Retryable, dispatch.Delivered, dispatch.NotAttempted, dispatch.Retryable}
	if got := sinktest.Outcomes(rs); !slices.Equal(got, want) {
		t.Fatalf("outcomes %v, want %v (%v)", got, want, rs[0].Err)
	}
	if msg := rs[0].Err.Error(); !strings.Contains(msg, `"outbox.event.missing" does not exist`) {
		t.Errorf("error %q does not name the missing stream", msg)
	}
	t.Logf("last_error: %s", rs[0].Err)
	createStream(t, k, "outbox.event.missing", 1)
	if got := sinktest.Outcomes(s.Send(context.Background(), sinktest.Batch(evs[0], evs[2], evs[3]))); !slices.Equal(got,
		[]dispatch.Outcome{dispatch.Delivered, dispatch.Delivered, dispatch.Delivered}) {
		t.Fatalf("after the stream was created: %v", got)
	}
}

// TestAnAggregateStopsAtItsFirstFailureInTheStream: with {event_type} in
// the template one aggregate's events go to several streams. Aggregate a's
// event 2 goes to a stream that does not exist (the call fails), aggregate
// b's event 5 has a stream name Kinesis refuses; their later events (4, 6),
// whose stream exists, are never written: the stream holds what the
// results say was delivered, nothing more. Results alone cannot tell, as
// later results of a failed aggregate read NotAttempted whatever was sent.
func TestAnAggregateStopsAtItsFirstFailureInTheStream(t *testing.T) {
	t.Parallel()
	k := testenv.StartKinesalite(t)
	createStream(t, k, "outbox.x", 1)
	s := newSink(t, k, Config{Stream: "outbox.{event_type}"})
	rs := s.Send(context.Background(), sinktest.Batch(sinktest.Typed(1, "a", "x"), sinktest.Typed(2, "a", "y"), sinktest.Typed(3, "b", "x"), sinktest.Typed(4, "a", "x"),
		sinktest.Typed(5, "b", "bad~"), sinktest.Typed(6, "b", "x"), sinktest.Typed(7, "c", "x")))
	want := []dispatch.Outcome{dispatch.Delivered, dispatch.Retryable, dispatch.Delivered, dispatch.NotAttempted,
		dispatch.Permanent, dispatch.NotAttempted, dispatch.Delivered}
	if got := sinktest.Outcomes(rs); !slices.Equal(got, want) {
		t.Fatalf("outcomes %v, want %v (%v, %v)", got, want, rs[1].Err, rs[4].Err)
	}
	var got []string
	for _, r := range read(t, k, "outbox.x") {
		got = append(got, r.PartitionKey+":"+r.env.Headers["id"])
	}
	if fmt.Sprint(got) != "[order/a:1 order/b:3 order/c:7]" {
		t.Errorf("outbox.x holds %v, want [order/a:1 order/b:3 order/c:7]: events 4 and 6 must not be written after their aggregate's 2 and 5 failed", got)
	}
}

// TestOversizeIsPermanentAndOthersFlow: a record above 1 MiB is Permanent
// without being sent (a call holding it would fail whole); its aggregate's
// earlier event is written, its later ones NotAttempted, other aggregates
// flow.
func TestOversizeIsPermanentAndOthersFlow(t *testing.T) {
	t.Parallel()
	k := testenv.StartKinesalite(t)
	createStream(t, k, "outbox.event.order", 1)
	s := newSink(t, k, Config{})
	big := sinktest.Event(2, "order", "a")
	big.Payload = json.RawMessage(`"` + strings.Repeat("x", 1<<20) + `"`)
	rs := s.Send(context.Background(), sinktest.Batch(sinktest.Event(1, "order", "a"), big, sinktest.Event(3, "order", "a"), sinktest.Event(4, "order", "b")))
	want := []dispatch.Outcome{dispatch.Delivered, dispatch.Permanent, dispatch.NotAttempted, dispatch.Delivered}
	if got := sinktest.Outcomes(rs); !slices.Equal(got, want) {
		t.Fatalf("outcomes %v, want %v (%v)", got, want, rs[1].Err)
	}
	if !strings.Contains(rs[1].Err.Error(), "Kinesis accepts 1048576") {
		t.Errorf("error %q", rs[1].Err)
	}
	if n := len(read(t, k, "outbox.event.order")); n != 2 {
		t.Errorf("stream holds %d records, want 2", n)
	}
}

// TestRefusedStreamNameIsPermanent: a row whose values make an invalid
// stream name is dead-lettered; the others flow.
func TestRefusedStreamNameIsPermanent(t *testing.T) {
	t.Parallel()
	k := testenv.StartKinesalite(t)
	createStream(t, k, "outbox.event.order", 1)
	s := newSink(t, k, Config{})
	rs := s.Send(context.Background(), sinktest.Batch(sinktest.Event(1, "bad type", "a"), sinktest.Event(2, "order", "a")))
	if got := sinktest.Outcomes(rs); !slices.Equal(got, []dispatch.Outcome{dispatch.Permanent, dispatch.Delivered}) {
		t.Fatalf("outcomes %v", got)
	}
	if !errors.Is(rs[0].Err, dispatch.ErrDestination) {
		t.Errorf("error %v: want ErrDestination", rs[0].Err)
	}
}

// TestNothingIsWrittenPastTheTrustDeadline: a batch whose deadline has
// passed is NotAttempted and the stream stays empty.
func TestNothingIsWrittenPastTheTrustDeadline(t *testing.T) {
	t.Parallel()
	k := testenv.StartKinesalite(t)
	createStream(t, k, "outbox.event.order", 1)
	s := newSink(t, k, Config{})
	past := time.Now().Add(-time.Second)
	rs := s.Send(context.Background(), dispatch.Batch{Events: []dispatch.Event{sinktest.Event(1, "order", "a")}, Token: 7,
		Until: func() time.Time { return past }})
	if rs[0].Outcome != dispatch.NotAttempted {
		t.Fatalf("outcome %v", rs[0].Outcome)
	}
	if n := len(read(t, k, "outbox.event.order")); n != 0 {
		t.Fatalf("stream holds %d records", n)
	}
}

// TestRecordFailedSaysWhatToDo: Kinesis refuses single records of a call
// for throughput, internal failures or the KMS key (kinesalite never
// does): each is retryable with advice naming the cause.
func TestRecordFailedSaysWhatToDo(t *testing.T) {
	for code, want := range map[string]string{
		"ProvisionedThroughputExceededException": "add shards",
		"InternalFailure":                        "retried",
		"KMSThrottlingException":                 "KMS key",
	} {
		err := recordFailed("s", code, "msg")
		if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), code) || dispatch.IsPermanent(err) {
			t.Errorf("%s: %v", code, err)
		}
	}
}

// TestChunksKeepKinesisLimits: calls hold one stream, at most 500 records
// and 5 MiB.
func TestChunksKeepKinesisLimits(t *testing.T) {
	var recs []record
	for i := range 1203 {
		recs = append(recs, record{i: i, stream: "a", size: 1000})
	}
	for i := range 12 {
		recs = append(recs, record{i: 2000 + i, stream: "b", size: 1 << 20})
	}
	var sizes []string
	for _, c := range chunks(recs) {
		bytes := 0
		for _, r := range c {
			bytes += r.size
			if r.stream != c[0].stream {
				t.Fatalf("a call with streams %s and %s", c[0].stream, r.stream)
			}
		}
		if len(c) > maxRecords || bytes > maxCallBytes {
			t.Fatalf("a call of %d records, %d bytes", len(c), bytes)
		}
		sizes = append(sizes, fmt.Sprintf("%s%d", c[0].stream, len(c)))
	}
	if fmt.Sprint(sizes) != "[a500 a500 a203 b5 b5 b2]" {
		t.Errorf("calls %v", sizes)
	}
}

// ceWant is ev's CloudEvent as outboxd maps a row (source outboxd).
func ceWant(ev dispatch.Event) cetest.Want {
	return cetest.Want{ID: ev.ID, Source: "outboxd", Type: ev.EventType, Time: ev.CreatedAt,
		AggregateType: ev.AggregateType, AggregateID: ev.AggregateID, Data: string(ev.Payload)}
}
