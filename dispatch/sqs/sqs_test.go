package sqs

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	neturl "net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/dispatch/internal/sinktest"
	"github.com/outboxd/outboxd/internal/cetest"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/internal/testkit"
)

// Tests against moto_server (internal/testenv.StartMoto), started per test:
// the sink sends, the test reads the queue back with its own client.

// No Postgres or Redis here: plain TestMain, still leak-checked.
func TestMain(m *testing.M) { testkit.VerifyTestMain(m) }

// newSink is a sink for queueURL on m, closed at cleanup.
func newSink(t *testing.T, m *testenv.Moto, queueURL string, ce bool) *Sink {
	t.Helper()
	return newSinkCE(t, m, queueURL, dispatch.CloudEvents{Enabled: ce})
}

// newSinkCE is newSink with CloudEvents as ce says.
func newSinkCE(t *testing.T, m *testenv.Moto, queueURL string, ce dispatch.CloudEvents) *Sink {
	t.Helper()
	s, err := New(t.Context(), Config{QueueURL: queueURL, Region: testenv.MotoRegion, Endpoint: m.Endpoint,
		CloudEvents: ce, Log: testkit.Logger(t),
		Options: []func(*config.LoadOptions) error{config.WithCredentialsProvider(m.Credentials())}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// events are n events per aggregate over aggs aggregates of type typ,
// interleaved (a0 a1 a2 a0 a1 a2 ...), ids from first.
func events(typ string, aggs, n int, first int64) []dispatch.Event {
	var out []dispatch.Event
	for k := range n {
		for a := range aggs {
			id := first + int64(len(out))
			out = append(out, dispatch.Event{ID: id, AggregateType: typ, AggregateID: strconv.Itoa(a), EventType: "test.event",
				Payload: json.RawMessage(fmt.Sprintf(`{"n":%d,"k":%d}`, id, k)), Headers: json.RawMessage(`{"traceparent":"00-abc-def-01"}`),
				CreatedAt: time.Date(2026, 11, 24, 3, 0, 0, 0, time.UTC)})
		}
	}
	return out
}

func batch(evs []dispatch.Event) dispatch.Batch {
	return dispatch.Batch{Events: evs, Token: 7, Until: func() time.Time { return time.Now().Add(time.Minute) }}
}

// attrs are a message's string attributes by name.
func attrs(m types.Message) map[string]string {
	out := map[string]string{}
	for k, v := range m.MessageAttributes {
		out[k] = aws.ToString(v.StringValue)
	}
	return out
}

// TestStandardQueueGetsEveryEventWithItsAttributes: 45 events over 9
// aggregates (five rounds, calls of ten) are each Delivered with a message
// id, and the queue holds each once, the payload as the body and the
// contract's headers as attributes; the row's traceparent too; every
// result went to Done as well.
func TestStandardQueueGetsEveryEventWithItsAttributes(t *testing.T) {
	t.Parallel()
	m := testenv.StartMoto(t)
	url := m.CreateQueue(t, "std", nil)
	s := newSink(t, m, url, false)
	evs := events("order", 9, 5, 100)
	b := batch(evs)
	var done []int
	b.Done = func(i int, r dispatch.Result) { done = append(done, i) } // the sink serialises Done per round
	out := s.Send(t.Context(), b)
	for i, r := range out {
		if r.Outcome != dispatch.Delivered || r.Ref == "" {
			t.Fatalf("event %d: %v %q (%v)", evs[i].ID, r.Outcome, r.Ref, r.Err)
		}
	}
	slices.Sort(done)
	if len(done) != len(evs) || done[0] != 0 || done[len(done)-1] != len(evs)-1 {
		t.Errorf("Done told %d results, want one per event", len(done))
	}
	byID := map[string]types.Message{}
	for _, msg := range m.Receive(t, url, len(evs)) {
		id := attrs(msg)["id"]
		if _, dup := byID[id]; dup {
			t.Errorf("event %s in the queue twice", id)
		}
		byID[id] = msg
	}
	for _, ev := range evs {
		msg, ok := byID[strconv.FormatInt(ev.ID, 10)]
		if !ok {
			t.Fatalf("event %d not in the queue", ev.ID)
		}
		a := attrs(msg)
		want := map[string]string{"id": strconv.FormatInt(ev.ID, 10), "aggregate_type": "order", "aggregate_id": ev.AggregateID,
			"event_type": "test.event", "created_at": "2026-11-24T03:00:00Z", "fencing_token": "7", "traceparent": "00-abc-def-01"}
		if fmt.Sprint(a) != fmt.Sprint(want) || aws.ToString(msg.Body) != string(ev.Payload) {
			t.Errorf("event %d: body %s attributes %v, want %s %v", ev.ID, aws.ToString(msg.Body), a, ev.Payload, want)
		}
		if _, ok := msg.Attributes["MessageGroupId"]; ok {
			t.Errorf("event %d: a message group on a standard queue", ev.ID)
		}
	}
}

// TestCloudEventsDecodeWithTheSDK: in both modes, every message the queue
// holds decodes with the CloudEvents SDK to its row's event, read as
// docs/sinks/sqs.md tells a consumer (attributes, then those packed in
// outboxd-headers; ce- names, structured when content-type is the event
// format).
func TestCloudEventsDecodeWithTheSDK(t *testing.T) {
	t.Parallel()
	m := testenv.StartMoto(t)
	for _, mode := range []string{dispatch.CloudEventsBinary, dispatch.CloudEventsStructured} {
		url := m.CreateQueue(t, "ce-"+mode, nil)
		s := newSinkCE(t, m, url, dispatch.CloudEvents{Enabled: true, Mode: mode})
		evs := events("order", 3, 2, 1)
		evs[1].AggregateID = `42 "x" 100% €`
		for i, r := range s.Send(t.Context(), batch(evs)) {
			if r.Outcome != dispatch.Delivered {
				t.Fatalf("%s: event %d: %v %v", mode, evs[i].ID, r.Outcome, r.Err)
			}
		}
		for _, msg := range m.Receive(t, url, len(evs)) {
			a, err := sinktest.Unpacked(attrs(msg))
			if err != nil {
				t.Fatalf("%s: %v", mode, err)
			}
			id, _ := strconv.Atoi(a["id"])
			if id < 1 || id > len(evs) {
				t.Fatalf("%s: message attributes %v: no event id", mode, a)
			}
			ce := cetest.Message{Prefix: "ce-", ContentType: a["content-type"], Headers: a, Body: []byte(aws.ToString(msg.Body))}
			if err := cetest.CheckEvent(ce, mode == dispatch.CloudEventsStructured, ceWant(evs[id-1])); err != nil {
				t.Errorf("%s: event %d (body %s, attributes %v): %v", mode, id, aws.ToString(msg.Body), a, err)
			}
		}
	}
}

// TestFIFOQueueKeepsEachAggregateInOrder: on a FIFO queue each event's
// group is {aggregate_type}/{aggregate_id} and its deduplication id the
// outbox id (these events carry no fingerprint: see
// TestFIFORewindWithinTheWindowIsDelivered); read back group by group, each aggregate's events are in id
// order; the same batch sent again is Delivered and the queue drops it.
func TestFIFOQueueKeepsEachAggregateInOrder(t *testing.T) {
	t.Parallel()
	m := testenv.StartMoto(t)
	url := m.CreateQueue(t, "ordered.fifo", nil)
	s := newSink(t, m, url, false)
	evs := events("deal", 4, 6, 1)
	for range 2 {
		for i, r := range s.Send(t.Context(), batch(evs)) {
			if r.Outcome != dispatch.Delivered {
				t.Fatalf("event %d: %v (%v)", evs[i].ID, r.Outcome, r.Err)
			}
		}
	}
	got := map[string][]int64{}
	for _, msg := range m.Receive(t, url, len(evs)) {
		a := attrs(msg)
		id, _ := strconv.ParseInt(a["id"], 10, 64)
		if g, want := msg.Attributes["MessageGroupId"], "deal/"+a["aggregate_id"]; g != want {
			t.Errorf("event %d: group %q, want %q", id, g, want)
		}
		if d := msg.Attributes["MessageDeduplicationId"]; d != a["id"] {
			t.Errorf("event %d: deduplication id %q, want the id", id, d)
		}
		got[a["aggregate_id"]] = append(got[a["aggregate_id"]], id)
	}
	if n, err := m.Count(t.Context(), url); err != nil || n != 0 {
		t.Errorf("after reading %d messages the queue still holds %d (%v): the repeat was not deduplicated", len(evs), n, err)
	}
	for agg, ids := range got {
		if len(ids) != 6 || !slices.IsSorted(ids) {
			t.Errorf("aggregate %s: %v, want its 6 ids in order", agg, ids)
		}
	}
}

// TestFIFORewindWithinTheWindowIsDelivered: rows that reuse the ids of
// rows sent a moment before (a sequence rewind, a re-import) have other
// deduplication ids, so the FIFO queue keeps every one of them inside its
// five-minute window; the same rows sent twice are still kept once.
func TestFIFORewindWithinTheWindowIsDelivered(t *testing.T) {
	t.Parallel()
	m := testenv.StartMoto(t)
	url := m.CreateQueue(t, "rewind.fifo", nil)
	s := newSink(t, m, url, false)
	first, second := sinktest.Generation("deal", 1), sinktest.Generation("deal", 2)
	for _, evs := range [][]dispatch.Event{first, second, second} {
		if got := sinktest.Outcomes(s.Send(t.Context(), sinktest.Batch(evs...))); !slices.Equal(got, []dispatch.Outcome{dispatch.Delivered, dispatch.Delivered, dispatch.Delivered}) {
			t.Fatalf("outcomes %v, want every event delivered", got)
		}
	}
	var bodies []string
	for _, msg := range m.Receive(t, url, len(first)+len(second)) {
		bodies = append(bodies, aws.ToString(msg.Body))
		if d, want := msg.Attributes["MessageDeduplicationId"], attrs(msg)["id"]+":"; !strings.HasPrefix(d, want) || len(d) == len(want) {
			t.Errorf("deduplication id %q, want the id, a colon and the fingerprint", d)
		}
	}
	if want := sinktest.Payloads(first, second); !slices.Equal(slices.Sorted(slices.Values(bodies)), want) {
		t.Errorf("the queue held %v, want each row of both generations: %v", bodies, want)
	}
	if n, err := m.Count(t.Context(), url); err != nil || n != 0 {
		t.Errorf("after reading both generations the queue still holds %d (%v): the repeat was not deduplicated", n, err)
	}
}

// TestOversizeMessageIsDeadLetteredAlone: a queue that takes 1 KiB
// messages refuses the call that holds a 2 KiB one (moto refuses the whole
// call, as SQS may): that event is Permanent, its aggregate's next one
// NotAttempted and never sent, and every other aggregate's events are
// Delivered.
func TestOversizeMessageIsDeadLetteredAlone(t *testing.T) {
	t.Parallel()
	m := testenv.StartMoto(t)
	url := m.CreateQueue(t, "small", map[string]string{"MaximumMessageSize": "1024"})
	s := newSink(t, m, url, false)
	evs := events("order", 5, 2, 1)
	evs[2].Payload = json.RawMessage(`"` + strings.Repeat("x", 2048) + `"`) // aggregate 2's first
	out := s.Send(t.Context(), batch(evs))
	for i, r := range out {
		want := dispatch.Delivered
		switch i {
		case 2:
			want = dispatch.Permanent
		case 7: // aggregate 2's second
			want = dispatch.NotAttempted
		}
		if r.Outcome != want {
			t.Errorf("event %d: %v (%v), want %v", evs[i].ID, r.Outcome, r.Err, want)
		}
	}
	if err := out[2].Err; err == nil || !strings.Contains(err.Error(), "shorter than") || !strings.Contains(err.Error(), "event 3") {
		t.Errorf("last_error %v: want the service's reason and the event", err)
	}
	ids := map[string]bool{}
	for _, msg := range m.Receive(t, url, 8) {
		ids[attrs(msg)["id"]] = true
	}
	if ids["3"] || ids["8"] || len(ids) != 8 {
		t.Errorf("queue holds ids %v, want the 8 of the other aggregates", ids)
	}
}

// TestMissingQueueIsRetried: a queue that does not exist fails each
// aggregate's first event as Retryable, saying so and naming the queue;
// their later events are NotAttempted.
func TestMissingQueueIsRetried(t *testing.T) {
	t.Parallel()
	m := testenv.StartMoto(t)
	url := m.QueueURL("nowhere")
	s := newSink(t, m, url, false)
	evs := events("order", 3, 2, 1)
	out := s.Send(t.Context(), batch(evs))
	for i, r := range out {
		want := dispatch.Retryable
		if i >= 3 {
			want = dispatch.NotAttempted
		}
		if r.Outcome != want {
			t.Fatalf("event %d: %v (%v), want %v", evs[i].ID, r.Outcome, r.Err, want)
		}
	}
	if msg := out[0].Err.Error(); !strings.Contains(msg, "does not exist") || !strings.Contains(msg, strconv.Quote(url)) {
		t.Errorf("last_error %q: want it to say the queue does not exist and name it", msg)
	}
}

// TestMoreThanTenAttributesArePacked: contract six + six row headers +
// CloudEvents eight: nine attributes, the rest in outboxd-headers as JSON;
// a header whose name an attribute cannot carry is left out.
func TestMoreThanTenAttributesArePacked(t *testing.T) {
	t.Parallel()
	m := testenv.StartMoto(t)
	url := m.CreateQueue(t, "many", nil)
	s := newSink(t, m, url, true)
	ev := events("order", 1, 1, 1)[0]
	ev.Headers = json.RawMessage(`{"h1":"1","h2":"2","h3":"3","h4":"4","h5":"5","h6":"6","bad name":"x"}`)
	if r := s.Send(t.Context(), batch([]dispatch.Event{ev})); r[0].Outcome != dispatch.Delivered {
		t.Fatalf("%v (%v)", r[0].Outcome, r[0].Err)
	}
	a := attrs(m.Receive(t, url, 1)[0])
	if len(a) != 10 {
		t.Errorf("%d attributes, want 10: %v", len(a), a)
	}
	var packed map[string]string
	if err := json.Unmarshal([]byte(a["outboxd-headers"]), &packed); err != nil {
		t.Fatalf("outboxd-headers %q: %v", a["outboxd-headers"], err)
	}
	all := map[string]string{}
	for k, v := range a {
		all[k] = v
	}
	for k, v := range packed {
		all[k] = v
	}
	delete(all, "outboxd-headers")
	for _, k := range []string{"id", "aggregate_type", "aggregate_id", "event_type", "created_at", "fencing_token",
		"h1", "h2", "h3", "h4", "h5", "h6", "ce-specversion", "ce-id", "ce-source", "ce-type", "ce-time", "ce-aggregatetype", "ce-aggregateid", "ce-datacontenttype"} {
		if all[k] == "" {
			t.Errorf("header %s lost: attributes %v, packed %v", k, a, packed)
		}
	}
	if _, ok := all["bad name"]; ok || len(all) != 20 {
		t.Errorf("want exactly the 20 headers, got %v", all)
	}
	for _, k := range []string{"id", "aggregate_type", "aggregate_id", "event_type", "created_at", "fencing_token"} {
		if _, ok := a[k]; !ok {
			t.Errorf("contract header %s is not an attribute of its own", k)
		}
	}
}

// TestNothingIsSentPastTheDeadline: a batch whose trust deadline has
// passed is NotAttempted and the queue stays empty.
func TestNothingIsSentPastTheDeadline(t *testing.T) {
	t.Parallel()
	m := testenv.StartMoto(t)
	url := m.CreateQueue(t, "late", nil)
	s := newSink(t, m, url, false)
	b := batch(events("order", 3, 1, 1))
	b.Until = func() time.Time { return time.Now().Add(-time.Second) }
	for i, r := range s.Send(t.Context(), b) {
		if r.Outcome != dispatch.NotAttempted {
			t.Errorf("event %d: %v, want not attempted", i, r.Outcome)
		}
	}
	if n, err := m.Count(t.Context(), url); err != nil || n != 0 {
		t.Errorf("queue holds %d messages (%v), want none", n, err)
	}
}

// TestUnreachableEndpointIsRetried: nothing listening fails the events as
// Retryable (not Cut: the lease did not end), within the call timeout.
func TestUnreachableEndpointIsRetried(t *testing.T) {
	t.Parallel()
	port := testenv.FreePort(t)
	s, err := New(t.Context(), Config{QueueURL: "http://127.0.0.1:1/" + testenv.MotoAccount + "/q", Region: testenv.MotoRegion,
		Endpoint: "http://127.0.0.1:" + strconv.Itoa(port), Timeout: 2 * time.Second,
		Options: []func(*config.LoadOptions) error{config.WithCredentialsProvider(testenv.StaticAWSCredentials())}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i, r := range s.Send(context.Background(), batch(events("order", 2, 1, 1))) {
		if r.Outcome != dispatch.Retryable || r.Cut {
			t.Errorf("event %d: %v cut=%v (%v), want retryable, not cut", i, r.Outcome, r.Cut, r.Err)
		}
	}
}

// TestBadConfigIsRefused: New refuses what cannot work, saying why.
func TestBadConfigIsRefused(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ url, endpoint, want string }{
		{"", "", "empty queue URL"},
		{"sqs.us-east-1.amazonaws.com/123456789012/q", "", "want https://"},
		{"https://sqs.us-east-1.amazonaws.com/q", "", "path must be"},
		{"https://sqs.us-east-1.amazonaws.com/123456789012/bad.name", "", "path must be"},
		{"https://user:secret@sqs.us-east-1.amazonaws.com/123456789012/q", "", "without credentials"},
		{"https://sqs.us-east-1.amazonaws.com/123456789012/q", "localhost:4566", "endpoint"},
	} {
		_, err := New(t.Context(), Config{QueueURL: c.url, Endpoint: c.endpoint})
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "secret") {
			t.Errorf("url %q endpoint %q: %v, want an error saying %q (and no secret)", c.url, c.endpoint, err, c.want)
		}
	}
	fifo, region, err := ParseQueueURL("https://sqs.eu-west-3.amazonaws.com/123456789012/orders.fifo")
	if err != nil || !fifo || region != "eu-west-3" {
		t.Errorf("FIFO URL: fifo %v region %q err %v", fifo, region, err)
	}
}

// ceWant is ev's CloudEvent as outboxd maps a row (source outboxd).
func ceWant(ev dispatch.Event) cetest.Want {
	return cetest.Want{ID: ev.ID, Source: "outboxd", Type: ev.EventType, Time: ev.CreatedAt,
		AggregateType: ev.AggregateType, AggregateID: ev.AggregateID, Data: string(ev.Payload)}
}

// TestAnEntryMissingFromTheAnswerIsRetried: moto behind a proxy that
// removes entry "1" (event 2, aggregate 1's first) from the first
// SendMessageBatch answer. An event the service did not answer for is not
// known to be delivered: it is Retryable, saying so, and its aggregate's
// next event (5) is NotAttempted and never sent; the other aggregates'
// events are Delivered.
func TestAnEntryMissingFromTheAnswerIsRetried(t *testing.T) {
	t.Parallel()
	m := testenv.StartMoto(t)
	url := m.CreateQueue(t, "dropped", nil)
	target, err := neturl.Parse(m.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	var dropped atomic.Bool
	proxy := httputil.NewSingleHostReverseProxy(target)
	tr := &http.Transport{}
	proxy.Transport = tr
	proxy.ModifyResponse = func(resp *http.Response) error {
		if resp.Request.Header.Get("X-Amz-Target") != "AmazonSQS.SendMessageBatch" || dropped.Load() {
			return nil
		}
		var answer map[string]json.RawMessage
		var ok []map[string]any
		body, err := io.ReadAll(resp.Body)
		if err == nil {
			err = json.Unmarshal(body, &answer)
		}
		if err == nil {
			err = json.Unmarshal(answer["Successful"], &ok)
		}
		if err != nil {
			return fmt.Errorf("answer %s: %w", body, err)
		}
		ok = slices.DeleteFunc(ok, func(e map[string]any) bool { return e["Id"] == "1" })
		answer["Successful"], _ = json.Marshal(ok)
		body, _ = json.Marshal(answer)
		dropped.Store(true)
		resp.Body, resp.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
		return nil
	}
	srv := httptest.NewServer(proxy)
	t.Cleanup(func() { srv.Close(); tr.CloseIdleConnections() })

	s, err := New(t.Context(), Config{QueueURL: url, Region: testenv.MotoRegion, Endpoint: srv.URL, Log: testkit.Logger(t),
		Options: []func(*config.LoadOptions) error{config.WithCredentialsProvider(m.Credentials())}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	evs := events("order", 3, 2, 1) // round 1: events 1-3 (entries 0-2), round 2: events 4-6
	out := s.Send(t.Context(), batch(evs))
	if !dropped.Load() {
		t.Fatal("the proxy saw no SendMessageBatch answer to drop an entry from")
	}
	for i, r := range out {
		want := dispatch.Delivered
		switch evs[i].ID {
		case 2:
			want = dispatch.Retryable
		case 5:
			want = dispatch.NotAttempted
		}
		if r.Outcome != want {
			t.Errorf("event %d: %v %q (%v), want %v", evs[i].ID, r.Outcome, r.Ref, r.Err, want)
		}
	}
	if err := out[1].Err; err == nil || !strings.Contains(err.Error(), "without this entry") || !strings.Contains(err.Error(), "event 2") {
		t.Errorf("last_error %v: want it to say the answer left the event out", err)
	}
	if n, err := m.Count(t.Context(), url); err != nil || n != 5 {
		t.Errorf("queue holds %d messages (%v), want 5: events 1-4 and 6 (event 2 arrived; its answer was lost)", n, err)
	}
	var ids []int
	for _, msg := range m.Receive(t, url, 5) {
		id, _ := strconv.Atoi(attrs(msg)["id"])
		ids = append(ids, id)
	}
	if slices.Sort(ids); fmt.Sprint(ids) != "[1 2 3 4 6]" {
		t.Errorf("queue holds events %v, want [1 2 3 4 6]: event 5 is sent only after event 2 is known delivered", ids)
	}
}
