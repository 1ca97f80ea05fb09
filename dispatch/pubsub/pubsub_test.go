package pubsub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/dispatch/internal/sinktest"
	"github.com/outboxd/outboxd/internal/cetest"
	"github.com/outboxd/outboxd/internal/testkit"
)

// Tests run against pstest, the client library's Pub/Sub emulator, in this
// process on a loopback port, reached over gRPC as the daemon reaches an
// emulator (endpoint "http://host:port").

func TestMain(m *testing.M) { testkit.VerifyTestMain(m) }

const project = "outboxd-test"

// emulator is a pstest server with topics; it is closed at cleanup.
type emulator struct {
	t   testing.TB
	srv *pstest.Server
}

func newEmulator(t testing.TB, topics ...string) *emulator {
	t.Helper()
	return newEmulatorWith(t, nil, topics...)
}

// newEmulatorWith is newEmulator with the server's reactors (pstest's
// hooks on its calls).
func newEmulatorWith(t testing.TB, opts []pstest.ServerReactorOption, topics ...string) *emulator {
	t.Helper()
	e := &emulator{t: t, srv: pstest.NewServerWithAddress("127.0.0.1:0", opts...)}
	t.Cleanup(func() { _ = e.srv.Close() })
	for _, tp := range topics {
		e.createTopic(tp)
	}
	return e
}

func (e *emulator) createTopic(id string) {
	e.t.Helper()
	if _, err := e.srv.GServer.CreateTopic(context.Background(), &pubsubpb.Topic{Name: "projects/" + project + "/topics/" + id}); err != nil {
		e.t.Fatalf("create topic %s: %v", id, err)
	}
}

// messages are the messages the emulator holds for topic id, in publish order.
func (e *emulator) messages(id string) []*pstest.Message {
	var out []*pstest.Message
	for _, m := range e.srv.Messages() {
		if m.Topic == "projects/"+project+"/topics/"+id {
			out = append(out, m)
		}
	}
	slices.SortFunc(out, func(a, b *pstest.Message) int { // ids are "m<n>", n rising
		x, _ := strconv.Atoi(strings.TrimPrefix(a.ID, "m"))
		y, _ := strconv.Atoi(strings.TrimPrefix(b.ID, "m"))
		return x - y
	})
	return out
}

// sink is a Sink on e with cfg's other fields, closed at cleanup.
func (e *emulator) sink(cfg Config) *Sink {
	e.t.Helper()
	cfg.Project = project
	cfg.Endpoint = "http://" + e.srv.Addr
	cfg.Log = slog.New(slog.NewJSONHandler(io.MultiWriter(testkit.Writer(e.t)), &slog.HandlerOptions{Level: slog.LevelDebug}))
	s, err := New(context.Background(), cfg)
	if err != nil {
		e.t.Fatalf("New: %v", err)
	}
	e.t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestPublishesWithTheContractsMapping: every event is Delivered and held
// by the emulator once, with the payload as data, the contract's headers
// and the row's as attributes, CloudEvents' ce- attributes, and the
// aggregate as ordering key; per ordering key, in id order.
func TestPublishesWithTheContractsMapping(t *testing.T) {
	e := newEmulator(t, "outbox.event.order")
	s := e.sink(Config{CloudEvents: dispatch.CloudEvents{Enabled: true}})
	var evs []dispatch.Event
	for i := range 30 {
		evs = append(evs, sinktest.Event(int64(i+1), "order", strconv.Itoa(i%4)))
	}
	rs := s.Send(context.Background(), sinktest.Batch(evs...))
	for i, r := range rs {
		if r.Outcome != dispatch.Delivered || !strings.HasPrefix(r.Ref, "outbox.event.order/") {
			t.Fatalf("event %d: %v %q %v", evs[i].ID, r.Outcome, r.Ref, r.Err)
		}
	}
	msgs := e.messages("outbox.event.order")
	if len(msgs) != len(evs) {
		t.Fatalf("emulator holds %d messages, want %d", len(msgs), len(evs))
	}
	perKey := map[string][]int64{}
	for _, m := range msgs {
		a := m.Attributes
		id, err := strconv.ParseInt(a["id"], 10, 64)
		if err != nil {
			t.Fatalf("message %s: id attribute %q", m.ID, a["id"])
		}
		ev := evs[id-1]
		want := sinktest.Headers(ev, "ce-")
		want["Content-Type"] = "application/json" // datacontenttype (binding §3.1.1)
		if fmt.Sprint(a) != fmt.Sprint(want) {
			t.Errorf("message %s: attributes %v, want %v", m.ID, a, want)
		}
		if string(m.Data) != string(ev.Payload) {
			t.Errorf("message %s: data %q, want %q", m.ID, m.Data, ev.Payload)
		}
		if m.OrderingKey != "order/"+ev.AggregateID {
			t.Errorf("message %s: ordering key %q", m.ID, m.OrderingKey)
		}
		perKey[m.OrderingKey] = append(perKey[m.OrderingKey], id)
	}
	for k, ids := range perKey {
		if !slices.IsSorted(ids) {
			t.Errorf("ordering key %s: %v, want id order", k, ids)
		}
	}
}

// TestCloudEventsDecodeWithTheSDK: in both modes, every message the
// emulator holds decodes with the CloudEvents SDK, read as the Pub/Sub
// binding says (ce- attributes, Content-Type; structured when Content-Type
// is the event format), to its row's event, values as they are (no
// percent-encoding in attributes). A structured message has no ce-
// attribute: sdk-go's Pub/Sub protocol reads one with ce-specversion as
// binary.
func TestCloudEventsDecodeWithTheSDK(t *testing.T) {
	for _, mode := range []string{dispatch.CloudEventsBinary, dispatch.CloudEventsStructured} {
		t.Run(mode, func(t *testing.T) {
			e := newEmulator(t, "outbox.event.order")
			s := e.sink(Config{CloudEvents: dispatch.CloudEvents{Enabled: true, Mode: mode}})
			evs := []dispatch.Event{sinktest.Event(1, "order", "1"), sinktest.Event(2, "order", `42 "x" 100% €`), sinktest.Event(3, "order", "1")}
			for i, r := range s.Send(context.Background(), sinktest.Batch(evs...)) {
				if r.Outcome != dispatch.Delivered {
					t.Fatalf("event %d: %v %v", evs[i].ID, r.Outcome, r.Err)
				}
			}
			msgs := e.messages("outbox.event.order")
			if len(msgs) != len(evs) {
				t.Fatalf("emulator holds %d messages, want %d", len(msgs), len(evs))
			}
			for _, m := range msgs {
				id, _ := strconv.ParseInt(m.Attributes["id"], 10, 64)
				if id < 1 || id > int64(len(evs)) {
					t.Fatalf("message %s: id attribute %q", m.ID, m.Attributes["id"])
				}
				if _, ok := m.Attributes["ce-specversion"]; ok && mode == dispatch.CloudEventsStructured {
					t.Errorf("message %s: structured, with ce- attributes %v", m.ID, m.Attributes)
				}
				msg := cetest.Message{Prefix: "ce-", ContentType: m.Attributes["Content-Type"], Headers: m.Attributes, Body: m.Data}
				if err := cetest.CheckEvent(msg, mode == dispatch.CloudEventsStructured, ceWant(evs[id-1])); err != nil {
					t.Errorf("message %s (%s): %v", m.ID, m.Data, err)
				}
			}
		})
	}
}

// TestMissingTopicIsRetried: events for a topic that does not exist are
// Retryable with an error naming it, their aggregate's later events
// NotAttempted, other topics' events Delivered; once the topic exists, the
// same events go through.
func TestMissingTopicIsRetried(t *testing.T) {
	e := newEmulator(t, "outbox.event.order")
	s := e.sink(Config{})
	evs := []dispatch.Event{sinktest.Event(1, "missing", "a"), sinktest.Event(2, "order", "a"), sinktest.Event(3, "missing", "a"), sinktest.Event(4, "missing", "b")}
	rs := s.Send(context.Background(), sinktest.Batch(evs...))
	want := []dispatch.Outcome{dispatch.Retryable, dispatch.Delivered, dispatch.NotAttempted, dispatch.Retryable}
	if got := sinktest.Outcomes(rs); !slices.Equal(got, want) {
		t.Fatalf("outcomes %v, want %v (errors %v, %v)", got, want, rs[0].Err, rs[3].Err)
	}
	msg := rs[0].Err.Error()
	if !strings.Contains(msg, `"outbox.event.missing" does not exist`) || dispatch.IsPermanent(rs[0].Err) {
		t.Errorf("error %q: want a retryable one naming the missing topic", msg)
	}
	t.Logf("last_error: %s", msg)

	e.createTopic("outbox.event.missing")
	retry := []dispatch.Event{evs[0], evs[2], evs[3]}
	if got := sinktest.Outcomes(s.Send(context.Background(), sinktest.Batch(retry...))); !slices.Equal(got, []dispatch.Outcome{dispatch.Delivered, dispatch.Delivered, dispatch.Delivered}) {
		t.Fatalf("after the topic was created: %v, want all delivered", got)
	}
	var got []string
	for _, m := range e.messages("outbox.event.missing") {
		got = append(got, m.OrderingKey+":"+m.Attributes["id"])
	}
	if fmt.Sprint(got) != "[missing/a:1 missing/a:3 missing/b:4]" {
		t.Errorf("topic holds %v", got)
	}
}

// TestOversizeIsPermanentAndTheKeyFlowsOn: a message above Pub/Sub's
// request limit is Permanent (dead-lettered) without reaching the service,
// its aggregate's later events NotAttempted, others Delivered; its
// aggregate's next event, in a later batch, is delivered.
func TestOversizeIsPermanentAndTheKeyFlowsOn(t *testing.T) {
	e := newEmulator(t, "outbox.event.order")
	s := e.sink(Config{})
	big := sinktest.Event(1, "order", "a")
	big.Payload = json.RawMessage(`"` + strings.Repeat("x", 10_500_000) + `"`)
	rs := s.Send(context.Background(), sinktest.Batch(big, sinktest.Event(2, "order", "a"), sinktest.Event(3, "order", "b")))
	if got := sinktest.Outcomes(rs); !slices.Equal(got, []dispatch.Outcome{dispatch.Permanent, dispatch.NotAttempted, dispatch.Delivered}) {
		t.Fatalf("outcomes %v (%v)", got, rs[0].Err)
	}
	if !strings.Contains(rs[0].Err.Error(), "larger than") {
		t.Errorf("error %q does not say the message is too large", rs[0].Err)
	}
	if got := sinktest.Outcomes(s.Send(context.Background(), sinktest.Batch(sinktest.Event(2, "order", "a")))); got[0] != dispatch.Delivered {
		t.Fatalf("the aggregate's next event after the oversize one: %v, want delivered", got)
	}
}

// TestAnAggregateAcrossTopicsKeepsItsOrder: with {event_type} in the
// template one aggregate's events go to several topics; when one of them
// fails, none of the aggregate's later events is published, whatever its
// topic (a request succeeds or fails whole, and a later event waits for the
// earlier one's answer).
func TestAnAggregateAcrossTopicsKeepsItsOrder(t *testing.T) {
	e := newEmulator(t, "outbox.x")
	s := e.sink(Config{Topic: "outbox.{event_type}"})
	rs := s.Send(context.Background(), sinktest.Batch(sinktest.Typed(1, "a", "x"), sinktest.Typed(2, "a", "y"), sinktest.Typed(3, "b", "x"), sinktest.Typed(4, "a", "x"), sinktest.Typed(5, "b", "x")))
	want := []dispatch.Outcome{dispatch.Delivered, dispatch.Retryable, dispatch.Delivered, dispatch.NotAttempted, dispatch.Delivered}
	if got := sinktest.Outcomes(rs); !slices.Equal(got, want) {
		t.Fatalf("outcomes %v, want %v", got, want)
	}
	var got []string
	for _, m := range e.messages("outbox.x") {
		got = append(got, m.OrderingKey+":"+m.Attributes["id"])
	}
	if fmt.Sprint(got) != "[order/a:1 order/b:3 order/b:5]" {
		t.Errorf("outbox.x holds %v: event 4 must not be published after event 2 failed", got)
	}
}

// held lists the ordering key and id of each message the emulator holds
// for topic id, in publish order.
func (e *emulator) held(id string) []string {
	var out []string
	for _, m := range e.messages(id) {
		out = append(out, m.OrderingKey+":"+m.Attributes["id"])
	}
	return out
}

// TestARefusedEventStopsItsAggregateAtTheEmulator: an event whose topic
// name Pub/Sub would refuse (event 2) is dead-lettered without being sent,
// and its aggregate's later event (3), whose topic exists, is never
// published: the emulator holds what the results say was delivered,
// nothing more. Results alone cannot tell, as later results of a failed
// aggregate read NotAttempted whatever was sent.
func TestARefusedEventStopsItsAggregateAtTheEmulator(t *testing.T) {
	e := newEmulator(t, "outbox.x")
	s := e.sink(Config{Topic: "outbox.{event_type}"})
	rs := s.Send(context.Background(), sinktest.Batch(sinktest.Typed(1, "a", "x"), sinktest.Typed(2, "a", "bad/type"), sinktest.Typed(3, "a", "x"), sinktest.Typed(4, "b", "x")))
	want := []dispatch.Outcome{dispatch.Delivered, dispatch.Permanent, dispatch.NotAttempted, dispatch.Delivered}
	if got := sinktest.Outcomes(rs); !slices.Equal(got, want) {
		t.Fatalf("outcomes %v, want %v (%v)", got, want, rs[1].Err)
	}
	if got := e.held("outbox.x"); fmt.Sprint(got) != "[order/a:1 order/b:4]" {
		t.Errorf("outbox.x holds %v, want [order/a:1 order/b:4]: event 3 must not be published after event 2 was refused", got)
	}
}

// refuseID is a pstest reactor that refuses (PermissionDenied, which the
// client does not retry) every publish request holding the message whose
// id attribute is id.
type refuseID struct{ id string }

func (r refuseID) React(req any) (bool, any, error) {
	if p, ok := req.(*pubsubpb.PublishRequest); ok && slices.ContainsFunc(p.Messages, func(m *pubsubpb.PubsubMessage) bool {
		return m.Attributes["id"] == r.id
	}) {
		return false, nil, status.Error(codes.PermissionDenied, "refused by the test")
	}
	return false, nil, nil
}

// TestAFailedRequestStopsItsAggregatesLaterRequests: aggregate a's 1,001
// events to one topic take two requests (1,000 messages at most each);
// the service refuses the first. Event 1,001 of a, in the second request,
// is never published; b's event in that request is.
func TestAFailedRequestStopsItsAggregatesLaterRequests(t *testing.T) {
	e := newEmulatorWith(t, []pstest.ServerReactorOption{{FuncName: "Publish", Reactor: refuseID{"1"}}}, "outbox.event.order")
	s := e.sink(Config{})
	var evs []dispatch.Event
	for id := int64(1); id <= maxRequestMessages+1; id++ {
		evs = append(evs, sinktest.Event(id, "order", "a"))
	}
	evs = append(evs, sinktest.Event(maxRequestMessages+2, "order", "b"))
	rs := s.Send(context.Background(), sinktest.Batch(evs...))
	for i, r := range rs {
		want := dispatch.NotAttempted // a's after its first
		switch {
		case i == 0:
			want = dispatch.Retryable
		case i > maxRequestMessages:
			want = dispatch.Delivered
		}
		if r.Outcome != want {
			t.Fatalf("event %d: %v (%v), want %v", evs[i].ID, r.Outcome, r.Err, want)
		}
	}
	if got := e.held("outbox.event.order"); fmt.Sprint(got) != "[order/b:1002]" {
		t.Errorf("the topic holds %v, want [order/b:1002]: event 1001 must not be published after its aggregate's request failed", got)
	}
}

// TestRequestsKeepPubSubsLimits: a request holds at most 1,000 messages
// and 10 MB.
func TestRequestsKeepPubSubsLimits(t *testing.T) {
	var items []item
	for range 2500 {
		items = append(items, item{size: 100})
	}
	for range 5 {
		items = append(items, item{size: 4_000_000})
	}
	var sizes []int
	for _, r := range requestsOf(items) {
		bytes := requestOverhead
		for _, it := range r {
			bytes += it.size
		}
		if len(r) > maxRequestMessages || bytes > maxRequestBytes {
			t.Fatalf("a request of %d messages, %d bytes", len(r), bytes)
		}
		sizes = append(sizes, len(r))
	}
	if fmt.Sprint(sizes) != "[1000 1000 502 2 1]" {
		t.Errorf("requests %v", sizes)
	}
}

// TestRefusedTopicNameIsPermanent: a row whose values make an invalid
// topic ID is dead-lettered; the rest of the batch flows.
func TestRefusedTopicNameIsPermanent(t *testing.T) {
	e := newEmulator(t, "outbox.event.order")
	s := e.sink(Config{})
	rs := s.Send(context.Background(), sinktest.Batch(sinktest.Event(1, "bad/type", "a"), sinktest.Event(2, "order", "a")))
	if got := sinktest.Outcomes(rs); !slices.Equal(got, []dispatch.Outcome{dispatch.Permanent, dispatch.Delivered}) {
		t.Fatalf("outcomes %v", got)
	}
	if !errors.Is(rs[0].Err, dispatch.ErrDestination) {
		t.Errorf("error %v: want ErrDestination", rs[0].Err)
	}
}

// TestNothingIsPublishedPastTheTrustDeadline: a batch whose deadline has
// passed is all NotAttempted and the emulator holds nothing.
func TestNothingIsPublishedPastTheTrustDeadline(t *testing.T) {
	e := newEmulator(t, "outbox.event.order")
	s := e.sink(Config{})
	past := time.Now().Add(-time.Second)
	rs := s.Send(context.Background(), dispatch.Batch{Events: []dispatch.Event{sinktest.Event(1, "order", "a")}, Token: 7,
		Until: func() time.Time { return past }})
	if rs[0].Outcome != dispatch.NotAttempted {
		t.Fatalf("outcome %v, want not attempted", rs[0].Outcome)
	}
	if n := len(e.srv.Messages()); n != 0 {
		t.Fatalf("emulator holds %d messages", n)
	}
}

// TestAttributesKeepPubSubsLimits: row headers Pub/Sub would refuse (a
// value above 1024 bytes, a goog* key) are left out; the message goes.
func TestAttributesKeepPubSubsLimits(t *testing.T) {
	e := newEmulator(t, "outbox.event.order")
	s := e.sink(Config{})
	ev := sinktest.Event(1, "order", "a")
	ev.Headers = json.RawMessage(`{"big":"` + strings.Repeat("v", 1025) + `","googx":"1","ok":"yes"}`)
	if rs := s.Send(context.Background(), sinktest.Batch(ev)); rs[0].Outcome != dispatch.Delivered {
		t.Fatalf("%v %v", rs[0].Outcome, rs[0].Err)
	}
	a := e.messages("outbox.event.order")[0].Attributes
	if _, ok := a["big"]; ok || a["googx"] != "" || a["ok"] != "yes" {
		t.Errorf("attributes %v", a)
	}
}

// TestBadConfigIsRefused: each setting's error names it.
func TestBadConfigIsRefused(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "project"},
		{Config{Project: "p", Topic: "x.{nope}"}, "topic"},
		{Config{Project: "p", Topic: "goog.{aggregate_type}"}, "goog"},
		{Config{Project: "p", Endpoint: "127.0.0.1:8085"}, "endpoint"},
		{Config{Project: "p", Endpoint: "ftp://x:1"}, "endpoint"},
	} {
		err := CheckConfig(c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error naming %s", c.cfg, err, c.want)
		}
	}
	if err := CheckConfig(Config{Project: "p", Endpoint: "https://europe-west1-pubsub.googleapis.com"}); err != nil {
		t.Errorf("https endpoint: %v", err)
	}
}

// ceWant is ev's CloudEvent as outboxd maps a row (source outboxd).
func ceWant(ev dispatch.Event) cetest.Want {
	return cetest.Want{ID: ev.ID, Source: "outboxd", Type: ev.EventType, Time: ev.CreatedAt,
		AggregateType: ev.AggregateType, AggregateID: ev.AggregateID, Data: string(ev.Payload)}
}
