package kafka

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/internal/cetest"
	"github.com/outboxd/outboxd/internal/testkit"
)

// TestMapping: the record is the contract's mapping of the row: value = the
// payload bytes as they are, key = aggregate_id, the contract's headers in
// order with the row's headers after them (a colliding one dropped, with
// one warning per batch), ce_ attributes only when enabled, and the topic
// from the template.
func TestMapping(t *testing.T) {
	clusters(t, func(t *testing.T, c *cluster) {
		tmpl := c.prefix + ".{aggregate_type}.{event_type}"
		deal, order := c.topic("deal.deal.funded"), c.topic("order.order.placed")
		c.create(1, deal, order)
		var logs testkit.Logs
		plainSink := c.sink(tmpl, func(cfg *Config) { cfg.Log = slog.New(slog.NewJSONHandler(&logs, nil)) })
		ceSink := c.sink(tmpl, func(cfg *Config) {
			cfg.CloudEvents = dispatch.CloudEvents{Enabled: true, Source: "billing"}
		})

		payload := `{"b": 1,  "a":[1, 2 ], "s":"\u00e9"}` // spacing and order as the row has them
		first := dispatch.Event{ID: 41, AggregateType: "deal", AggregateID: "42", EventType: "deal.funded",
			Payload: json.RawMessage(payload), CreatedAt: created,
			Headers: json.RawMessage(`{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","n":5,"id":"spoof","Event_Type":"spoof","bad\nname":"x"}`)}
		second := dispatch.Event{ID: 43, AggregateType: "order", AggregateID: "", EventType: "order.placed",
			Payload: json.RawMessage(`{}`), CreatedAt: created, Headers: json.RawMessage(`{"fencing_token":"1"}`)}
		wantOutcomes(t, send(t, plainSink, batch(first, second)), dispatch.Delivered, dispatch.Delivered)
		third := first
		third.ID = 44
		wantOutcomes(t, send(t, ceSink, batch(third)), dispatch.Delivered)

		dealRecs, orderRecs := c.landed(deal), c.landed(order)
		if len(dealRecs) != 2 || len(orderRecs) != 1 {
			t.Fatalf("landed %d records in %s and %d in %s, want 2 and 1", len(dealRecs), deal, len(orderRecs), order)
		}
		r := dealRecs[0]
		if string(r.Value) != payload {
			t.Errorf("value %q, want the payload as is %q", r.Value, payload)
		}
		if string(r.Key) != "42" {
			t.Errorf("key %q, want aggregate_id 42", r.Key)
		}
		wantHeaders := [][2]string{
			{"id", "41"}, {"aggregate_type", "deal"}, {"aggregate_id", "42"}, {"event_type", "deal.funded"},
			{"created_at", "2025-03-04T05:06:07.891Z"}, {"fencing_token", strconv.Itoa(testToken)},
			{"n", "5"}, {"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		}
		if got := headerPairs(r); !slices.Equal(got, wantHeaders) {
			t.Errorf("headers\n got %v\nwant %v", got, wantHeaders)
		}
		if _, err := time.Parse(time.RFC3339, wantHeaders[4][1]); err != nil {
			t.Errorf("created_at is not RFC 3339: %v", err)
		}
		if o := orderRecs[0]; string(o.Key) != "" || o.Key == nil {
			t.Errorf("empty aggregate_id: key %q (nil %v), want an empty, non-null key", o.Key, o.Key == nil)
		}
		if v, _ := header(orderRecs[0], "fencing_token"); v != strconv.Itoa(testToken) {
			t.Errorf("a row header named fencing_token overrode the token: %q", v)
		}

		// CloudEvents: the Kafka binding's ce_ prefix, after the rest.
		ce := headerPairs(dealRecs[1])
		wantCE := [][2]string{{"ce_specversion", "1.0"}, {"ce_id", "44"}, {"ce_source", "billing"}, {"ce_type", "deal.funded"}, {"ce_time", "2025-03-04T05:06:07.891Z"},
			{"ce_aggregatetype", "deal"}, {"ce_aggregateid", "42"}, {"content-type", "application/json"}}
		if len(ce) < len(wantCE) || !slices.Equal(ce[len(ce)-len(wantCE):], wantCE) {
			t.Errorf("CloudEvents headers: got %v, want them to end with %v", ce, wantCE)
		}
		for _, rec := range append(orderRecs, r) {
			for _, h := range rec.Headers {
				if strings.HasPrefix(h.Key, "ce") || h.Key == "content-type" {
					t.Errorf("CloudEvents disabled, yet header %s", h.Key)
				}
			}
		}

		// One warning for the batch, naming an event and what it lost.
		warns := logs.Count(`"level":"WARN"`)
		line := logs.WaitLine(t, time.Second, "row headers dropped")
		if warns != 1 || !strings.Contains(line, `"outbox_id":41`) || !strings.Contains(line, `"Event_Type"`) ||
			!strings.Contains(line, `"id"`) || !strings.Contains(line, `"bad\nname"`) || !strings.Contains(line, `"other_events_with_dropped_headers":1`) {
			t.Errorf("%d warnings; want one naming outbox_id 41 and its dropped headers, and one other event: %s", warns, line)
		}
	})
}

// TestCloudEventsDecodeWithTheSDK: in both modes the record that landed
// decodes, as the Kafka binding defines it (ce_ headers, content-type for
// datacontenttype or the event format), with the CloudEvents SDK to the
// row's event; the key stays aggregate_id.
func TestCloudEventsDecodeWithTheSDK(t *testing.T) {
	clusters(t, func(t *testing.T, c *cluster) {
		for _, mode := range []string{dispatch.CloudEventsBinary, dispatch.CloudEventsStructured} {
			topic := c.topic("ce." + mode)
			c.create(1, topic)
			s := c.sink(topic, func(cfg *Config) {
				cfg.CloudEvents = dispatch.CloudEvents{Enabled: true, Source: "urn:billing eu", Mode: mode}
			})
			ev := event(45, "deal", "42 €")
			ev.EventType = "deal funded"
			wantOutcomes(t, send(t, s, batch(ev)), dispatch.Delivered)
			r := c.landed(topic)[0]
			h := map[string]string{}
			for _, x := range r.Headers {
				h[x.Key] = string(x.Value)
			}
			got, err := cetest.Decode(cetest.Message{Prefix: "ce_", ContentType: h["content-type"], Headers: h, Body: r.Value})
			if err != nil {
				t.Fatalf("%s: the SDK cannot decode %v / %s: %v", mode, h, r.Value, err)
			}
			if err := cetest.Check(got, cetest.Want{ID: 45, Source: "urn:billing eu", Type: "deal funded",
				Time: created, AggregateType: "deal", AggregateID: "42 €", Data: string(ev.Payload)}); err != nil {
				t.Errorf("%s: decoded %s\n%v", mode, got, err)
			}
			if string(r.Key) != "42 €" || h["id"] != "45" {
				t.Errorf("%s: key %q, headers %v: the contract's mapping is kept in every mode", mode, r.Key, h)
			}
		}
	})
}

func headerPairs(r *kgo.Record) [][2]string {
	out := make([][2]string, len(r.Headers))
	for i, h := range r.Headers {
		out[i] = [2]string{h.Key, string(h.Value)}
	}
	return out
}

// TestResults: one Delivered result per event, aligned by index, its Ref
// the record's topic/partition@offset; each aggregate's events in one
// partition, in the batch's order, batch after batch.
func TestResults(t *testing.T) {
	clusters(t, func(t *testing.T, c *cluster) {
		topic := c.topic("deal")
		c.create(3, topic)
		s := c.sink(c.prefix + ".{aggregate_type}")
		var all []dispatch.Event
		for round := range 3 {
			var events []dispatch.Event
			for i := range 60 {
				id := int64(round*60 + i + 1)
				events = append(events, event(id, "deal", strconv.Itoa(i%12)))
			}
			out := send(t, s, batch(events...))
			for i, r := range out {
				if r.Outcome != dispatch.Delivered || !strings.HasPrefix(r.Ref, topic+"/") {
					t.Fatalf("event %d: %s ref %q err %v", events[i].ID, r.Outcome, r.Ref, r.Err)
				}
			}
			all = append(all, events...)
			checkRefs(t, c, topic, events, out)
		}
		recs := c.landed(topic)
		if len(recs) != len(all) {
			t.Fatalf("%d records landed, want %d (once each)", len(recs), len(all))
		}
		checkOrder(t, recs)
	})
}

// checkRefs: each result's Ref is where its event's record is.
func checkRefs(t *testing.T, c *cluster, topic string, events []dispatch.Event, out []dispatch.Result) {
	t.Helper()
	at := map[string]int64{}
	recs := c.landed(topic)
	for i, r := range recs {
		at[ref(r)] = ids(t, recs)[i]
	}
	for i, r := range out {
		if got := at[r.Ref]; got != events[i].ID {
			t.Errorf("result %d (event %d): Ref %s holds event %d", i, events[i].ID, r.Ref, got)
		}
	}
}

// checkOrder: an aggregate's records are in one partition, in id order.
func checkOrder(t *testing.T, recs []*kgo.Record) {
	t.Helper()
	part := map[string]int32{}
	last := map[string]int64{}
	for i, id := range ids(t, recs) {
		key := string(recs[i].Key)
		if p, ok := part[key]; ok && p != recs[i].Partition {
			t.Errorf("aggregate %s in partitions %d and %d", key, p, recs[i].Partition)
		}
		part[key] = recs[i].Partition
		if id <= last[key] {
			t.Errorf("aggregate %s: event %d after %d", key, id, last[key])
		}
		last[key] = id
	}
}

// TestDeliveredOnlyAfterAck: while the broker holds the produce request,
// Send has not returned; once the broker answers, the events are Delivered.
func TestDeliveredOnlyAfterAck(t *testing.T) {
	c := newFake(t)
	topic := c.topic("deal")
	c.create(1, topic)
	s := c.sink(c.prefix + ".{aggregate_type}")
	held, release, _ := holdProduce(t, c.fake)
	done := make(chan []dispatch.Result, 1)
	go func() { done <- s.Send(context.Background(), batch(event(1, "deal", "a"), event(2, "deal", "b"))) }()
	select {
	case <-held:
	case <-time.After(waitTimeout):
		t.Fatal("no produce request reached the broker")
	}
	select {
	case out := <-done:
		t.Fatalf("Send returned %v while the broker had not answered", out)
	default:
	}
	release()
	wantOutcomes(t, <-done, dispatch.Delivered, dispatch.Delivered)
}

// holdProduce makes kfake hold the next produce request unanswered until
// release (or cleanup); held is closed when it arrives. requests counts the
// produce requests that reached the broker, the held one included; the
// others are answered as usual.
func holdProduce(t *testing.T, fake *kfake.Cluster) (held <-chan struct{}, release func(), requests func() int64) {
	t.Helper()
	arrived, free := make(chan struct{}), make(chan struct{})
	var n atomic.Int64
	fake.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		if n.Add(1) == 1 {
			close(arrived)
			fake.SleepControl(func() { <-free })
		}
		return nil, nil, false // answered by the cluster as usual
	})
	var once sync.Once
	release = func() { once.Do(func() { close(free) }) }
	t.Cleanup(release)
	return arrived, release, n.Load
}

// TestFailureModes: each way a produce can fail gives the documented
// outcome, with an error that names the topic and says what to do, while
// another aggregate in the same batch is delivered.
func TestFailureModes(t *testing.T) {
	cases := []struct {
		name    string
		fault   *kfake.Fault // on the failing topic's produce requests (kfake only)
		missing bool         // the failing topic is not created
		want    dispatch.Outcome
		errHas  []string
	}{
		{name: "not leader once", fault: &kfake.Fault{Err: kerr.NotLeaderForPartition, Count: 1}, want: dispatch.Delivered},
		{name: "not leader for good", fault: &kfake.Fault{Err: kerr.NotLeaderForPartition, Count: -1}, want: dispatch.Retryable,
			errHas: []string{"not acknowledged within 2s", "no leader"}},
		{name: "message too large", fault: &kfake.Fault{Err: kerr.MessageTooLarge, Count: -1}, want: dispatch.Permanent,
			errHas: []string{"MESSAGE_TOO_LARGE", "max.message.bytes", "replay"}},
		{name: "record list too large", fault: &kfake.Fault{Err: kerr.RecordListTooLarge, Count: -1}, want: dispatch.Permanent,
			errHas: []string{"RECORD_LIST_TOO_LARGE"}},
		{name: "invalid topic", fault: &kfake.Fault{Err: kerr.InvalidTopicException, Count: -1}, want: dispatch.Permanent,
			errHas: []string{"INVALID_TOPIC_EXCEPTION", "dispatch.kafka.topic"}},
		{name: "not authorized", fault: &kfake.Fault{Err: kerr.TopicAuthorizationFailed, Count: -1}, want: dispatch.Retryable,
			errHas: []string{"TOPIC_AUTHORIZATION_FAILED", "grant"}},
		{name: "unknown topic", missing: true, want: dispatch.Retryable,
			errHas: []string{"does not exist", "create it", "UNKNOWN_TOPIC_OR_PARTITION"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clusters(t, func(t *testing.T, c *cluster) {
				if tc.fault != nil {
					c.needFake()
				}
				good, bad := c.topic("good"), c.topic("bad")
				c.create(1, good)
				if !tc.missing {
					c.create(1, bad)
				} else {
					c.deleteAtCleanup(bad) // in case the cluster creates it
				}
				var fh *kfake.FaultHandle
				if tc.fault != nil {
					f := *tc.fault
					f.Keys, f.Topic = []kmsg.Key{kmsg.Produce}, bad
					fh = c.fake.Fault(f)
				}
				// Long enough for franz-go to give up on a missing topic
				// (about a second), except where the timeout is the point.
				timeout := 5 * time.Second
				if tc.name == "not leader for good" {
					timeout = 2 * time.Second
				}
				s := c.sink(c.prefix+".{aggregate_type}", func(cfg *Config) { cfg.Timeout = timeout })
				out := send(t, s, batch(event(1, "bad", "x"), event(2, "good", "y"), event(3, "bad", "x")))
				if tc.missing && c.fake == nil && out[0].Outcome == dispatch.Delivered {
					t.Skip("this cluster creates topics on first use (auto.create.topics.enable)")
				}
				second := dispatch.Delivered
				if tc.want != dispatch.Delivered {
					second = dispatch.NotAttempted
				}
				wantOutcomes(t, out, tc.want, dispatch.Delivered, second)
				if tc.want == dispatch.Delivered {
					if n := len(c.landed(bad)); n != 2 {
						t.Errorf("%d records landed, want 2 (the producer's own retry is not a duplicate)", n)
					}
					return
				}
				r := out[0]
				if r.Cut {
					t.Errorf("Cut set: the broker failed it, not the deadline")
				}
				msg := fmt.Sprint(r.Err)
				t.Logf("%s: %s", tc.name, msg)
				for _, want := range append(tc.errHas, `"`+bad+`"`, "event 1") {
					if !strings.Contains(msg, want) {
						t.Errorf("error %q does not mention %q", msg, want)
					}
				}
				// Retryable means it can work later, with the same sink.
				if tc.want == dispatch.Retryable {
					if fh != nil {
						fh.Remove()
					}
					if tc.missing {
						c.create(1, bad)
					}
					delivers(t, s, batch(event(1, "bad", "x"), event(3, "bad", "x")))
				}
			})
		})
	}
}

// TestClientSideFailures: what the sink refuses before the broker sees it.
// An event larger than MaxMessageBytes and a topic name Kafka cannot have
// are Permanent; neither is produced.
func TestClientSideFailures(t *testing.T) {
	clusters(t, func(t *testing.T, c *cluster) {
		topic := c.topic("deal")
		c.create(1, topic)
		s := c.sink(c.prefix+".{aggregate_type}", func(cfg *Config) { cfg.MaxMessageBytes = 64 << 10 })
		big := event(1, "deal", "big")
		big.Payload = json.RawMessage(`"` + strings.Repeat("x", 100<<10) + `"`)
		badName := event(2, "deal/../x y", "z")
		out := send(t, s, batch(big, badName, event(3, "deal", "ok")))
		wantOutcomes(t, out, dispatch.Permanent, dispatch.Permanent, dispatch.Delivered)
		for _, want := range []string{"MESSAGE_TOO_LARGE", "dispatch.kafka.max_message_bytes", "event 1"} {
			if !strings.Contains(fmt.Sprint(out[0].Err), want) {
				t.Errorf("too large: %v; want it to mention %q", out[0].Err, want)
			}
		}
		for _, want := range []string{"Kafka allows", "dispatch.kafka.topic", "event 2", "INVALID_TOPIC_EXCEPTION"} {
			if !strings.Contains(fmt.Sprint(out[1].Err), want) {
				t.Errorf("bad name: %v; want it to mention %q", out[1].Err, want)
			}
		}
		if got := ids(t, c.landed(topic)); !slices.Equal(got, []int64{3}) {
			t.Errorf("landed %v, want only event 3", got)
		}
	})
}

// TestPrefixRule: an aggregate's successes are a prefix. Its second event
// fails (too large), so its third is NotAttempted although the broker took
// it; the other aggregate is unaffected.
func TestPrefixRule(t *testing.T) {
	clusters(t, func(t *testing.T, c *cluster) {
		topic := c.topic("deal")
		c.create(2, topic)
		s := c.sink(c.prefix+".{aggregate_type}", func(cfg *Config) { cfg.MaxMessageBytes = 64 << 10 })
		big := event(2, "deal", "a")
		big.Payload = json.RawMessage(`"` + strings.Repeat("x", 100<<10) + `"`)
		out := send(t, s, batch(event(1, "deal", "a"), event(4, "deal", "b"), big, event(3, "deal", "a"), event(5, "deal", "b")))
		wantOutcomes(t, out, dispatch.Delivered, dispatch.Delivered, dispatch.Permanent, dispatch.NotAttempted, dispatch.Delivered)
		got := ids(t, c.landed(topic))
		slices.Sort(got)
		if !slices.Equal(got, []int64{1, 3, 4, 5}) {
			t.Errorf("landed %v, want 1, 3, 4, 5 (3 was taken by the broker, reported NotAttempted)", got)
		}
	})
}

// TestDeadline: a batch whose trust deadline has passed, or whose context
// has ended, produces nothing: every event NotAttempted.
func TestDeadline(t *testing.T) {
	clusters(t, func(t *testing.T, c *cluster) {
		topic := c.topic("deal")
		c.create(1, topic)
		s := c.sink(c.prefix + ".{aggregate_type}")
		var observed *kfake.FaultHandle
		if c.fake != nil {
			observed = c.fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Observe: true, Count: -1})
		}
		past := batch(event(1, "deal", "a"), event(2, "deal", "b"))
		gone := time.Now().Add(-time.Second)
		past.Until = func() time.Time { return gone }
		wantOutcomes(t, send(t, s, past), dispatch.NotAttempted, dispatch.NotAttempted)

		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		wantOutcomes(t, s.Send(ctx, batch(event(3, "deal", "a"))), dispatch.NotAttempted)

		if n := len(c.landed(topic)); n != 0 {
			t.Errorf("%d records landed", n)
		}
		if observed != nil && observed.Hits() != 0 {
			t.Errorf("%d produce requests reached the broker", observed.Hits())
		}
	})
}

// TestDeadlineMidSend: the trust deadline passes while the broker holds a
// produce request. Every event is Retryable and Cut (or NotAttempted by
// the prefix rule), and the client writes no produce request after Send
// returned: what it had not sent is dropped, not sent late.
func TestDeadlineMidSend(t *testing.T) {
	c := newFake(t)
	topic := c.topic("deal")
	c.create(1, topic)
	writes := &produceWrites{}
	// Small record batches: the first requests carry a few each, the rest
	// wait in the producer behind the held one.
	s := c.sink(c.prefix+".{aggregate_type}", func(cfg *Config) {
		cfg.MaxMessageBytes = 4096
		cfg.hooks = []kgo.Hook{writes}
	})
	// Warm up: metadata and the producer id.
	wantOutcomes(t, send(t, s, batch(event(1, "deal", "a"))), dispatch.Delivered)

	held, release, _ := holdProduce(t, c.fake)
	var events []dispatch.Event
	for i := range 400 {
		events = append(events, event(int64(i+10), "deal", strconv.Itoa(i%5)))
	}
	b := batch(events...)
	until := time.Now().Add(500 * time.Millisecond)
	b.Until = func() time.Time { return until }
	out := send(t, s, b)
	atReturn := writes.n.Load()
	select {
	case <-held:
	case <-time.After(waitTimeout):
		t.Fatal("no produce request reached the broker before the deadline")
	}
	for i, r := range out {
		cut := r.Outcome == dispatch.Retryable && r.Cut && strings.Contains(fmt.Sprint(r.Err), "trust deadline")
		if !cut && r.Outcome != dispatch.NotAttempted {
			t.Fatalf("event %d: %s cut %v err %v; want Retryable and Cut, or NotAttempted", events[i].ID, r.Outcome, r.Cut, r.Err)
		}
	}
	release()
	_ = s.Close() // waits for what was in flight; fails what was buffered
	// Not asserted: that no produce request leaves after the deadline.
	// franz-go checks a record's context when it builds a request, and a
	// record queued behind a request in flight to its partition may still
	// be built after the deadline (seen once in 20 runs on a loaded
	// machine). What the contract needs holds: every such record was
	// reported Cut or NotAttempted, so it is sent again, and consumers
	// dedupe on the id (docs/sinks/kafka.md, "Bounded by the lease").
	if late := writes.queuedAfter(until); late > 0 {
		t.Logf("%d produce requests queued after the deadline (%d written after Send returned)", late, writes.n.Load()-atReturn)
	}
	// What landed: the warm-up event first, then records of this batch,
	// each once (the idempotent producer never writes one twice).
	landed := ids(t, c.landed(topic))
	if len(landed) < 2 || landed[0] != 1 {
		t.Fatalf("landed %v: want the warm-up event, then the records of the requests written", landed)
	}
	seen := map[int64]bool{}
	for _, id := range landed {
		if seen[id] {
			t.Fatalf("record %d landed twice", id)
		}
		seen[id] = true
	}
}

// produceWrites counts the produce requests a client wrote, and when each
// was queued for writing.
type produceWrites struct {
	n      atomic.Int64
	mu     sync.Mutex
	queued []time.Time
}

// OnBrokerWrite implements kgo.HookBrokerWrite: the request was queued
// writeWait before its write began, which took timeToWrite.
func (w *produceWrites) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, writeWait, timeToWrite time.Duration, err error) {
	if key == int16(kmsg.Produce) && err == nil {
		w.n.Add(1)
		w.mu.Lock()
		w.queued = append(w.queued, time.Now().Add(-timeToWrite-writeWait))
		w.mu.Unlock()
	}
}

// queuedAfter counts the produce requests queued after t.
func (w *produceWrites) queuedAfter(t time.Time) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, q := range w.queued {
		if q.After(t) {
			n++
		}
	}
	return n
}

// TestOutage: a broker down at New does not fail New; Send fails
// retryably, naming the cause; when the broker comes, and again when it
// restarts, the same sink delivers.
func TestOutage(t *testing.T) {
	port := freePort(t)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	dir := t.TempDir()
	s, err := New(Config{Brokers: []string{addr}, Topic: "outage.{aggregate_type}", Timeout: time.Second,
		Log: slog.New(slog.NewJSONHandler(testkit.Writer(t), nil))})
	if err != nil {
		t.Fatalf("New with the broker down: %v", err)
	}
	defer s.Close()
	down := func(id int64) {
		t.Helper()
		out := send(t, s, batch(event(id, "deal", "a")))
		wantOutcomes(t, out, dispatch.Retryable)
		msg := fmt.Sprint(out[0].Err)
		t.Logf("broker down: %s", msg)
		if out[0].Cut || !strings.Contains(msg, "not acknowledged within 1s") || !strings.Contains(msg, "connection refused") {
			t.Errorf("broker down: cut %v, error %q; want a plain retryable failure naming the connection error", out[0].Cut, msg)
		}
	}
	down(1)

	start := func() *kfake.Cluster {
		fake, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(port), kfake.DataDir(dir), kfake.SeedTopics(1, "outage.deal"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(fake.Close) // Close is idempotent
		return fake
	}
	// The client reconnects on its own, after a backoff from its failed
	// dials: the first sends may still fail (retryably).
	up := func(id int64) { delivers(t, s, batch(event(id, "deal", "a"))) }
	fake := start()
	up(2)
	fake.Close()
	down(3)
	fake = start() // a restart: same port, same data
	up(4)
	c := newCluster(t, fake.ListenAddrs(), fake)
	if got := ids(t, c.landed("outage.deal")); !slices.Contains(got, 2) || !slices.Contains(got, 4) {
		t.Errorf("landed %v, want 2 and 4 among them", got)
	}
}

// TestHungBroker: a broker that takes a produce request and never answers.
// The batch is Retryable (the sink's timeout, not the lease: not Cut); the
// next batch is not produced behind the unanswered records (franz-go
// would fail it with them) but reported Retryable; once the broker answers,
// the same sink delivers.
func TestHungBroker(t *testing.T) {
	c := newFake(t)
	topic := c.topic("deal")
	c.create(1, topic)
	s := c.sink(c.prefix+".{aggregate_type}", func(cfg *Config) { cfg.Timeout = 500 * time.Millisecond })
	delivers(t, s, batch(event(100, "deal", "a"))) // warm up: metadata and the producer id
	held, release, requests := holdProduce(t, c.fake)
	out := send(t, s, batch(event(1, "deal", "a"), event(2, "deal", "b")))
	select {
	case <-held:
	case <-time.After(waitTimeout):
		t.Fatal("no produce request reached the broker")
	}
	wantOutcomes(t, out, dispatch.Retryable, dispatch.Retryable)
	if out[0].Cut || !strings.Contains(fmt.Sprint(out[0].Err), "not acknowledged within 500ms") {
		t.Errorf("hung broker: cut %v err %v; want the sink's timeout named", out[0].Cut, out[0].Err)
	}

	before := requests()
	out = send(t, s, batch(event(3, "deal", "a"), event(4, "deal", "a")))
	wantOutcomes(t, out, dispatch.Retryable, dispatch.NotAttempted)
	if !strings.Contains(fmt.Sprint(out[0].Err), "earlier batch") {
		t.Errorf("blocked batch: %v; want it to say an earlier batch is unanswered", out[0].Err)
	}
	if requests() != before {
		t.Errorf("the blocked batch was produced")
	}

	release()
	delivers(t, s, batch(event(3, "deal", "a"), event(4, "deal", "a")))
	// The held records landed when the broker answered: a duplicate at
	// worst, never a loss.
	var first []int64 // first appearances, warm-up left out
	for _, id := range ids(t, c.landed(topic)) {
		if id != 100 && !slices.Contains(first, id) {
			first = append(first, id)
		}
	}
	if !slices.Equal(first, []int64{1, 2, 3, 4}) {
		t.Errorf("landed first %v, want 1 and 2 (held), then 3 and 4", first)
	}
}

// TestNew: only a config that cannot work fails New, with a message that
// names what is wrong and never echoes a credential.
func TestNew(t *testing.T) {
	bad := []struct {
		name string
		cfg  Config
		has  string
	}{
		{"no brokers", Config{}, "dispatch.kafka.brokers"},
		{"URL", Config{Brokers: []string{"kafka://u:hunter2@h:9092"}}, "not a URL"},
		{"credentials", Config{Brokers: []string{"u:hunter2@h:9092"}}, "not a URL"},
		{"no port", Config{Brokers: []string{"h"}}, "host:port"},
		{"bad port", Config{Brokers: []string{"h:99999"}}, "port"},
		{"unknown placeholder", Config{Brokers: []string{"h:9092"}, Topic: "outbox.{aggregate}"}, "unknown placeholder"},
		{"bad literal", Config{Brokers: []string{"h:9092"}, Topic: "outbox events.{aggregate_type}"}, "Kafka allows"},
		{"mechanism", Config{Brokers: []string{"h:9092"}, SASL: SASL{Mechanism: "GSSAPI", Username: "u", Password: "hunter2"}}, "GSSAPI"},
		{"no username", Config{Brokers: []string{"h:9092"}, SASL: SASL{Mechanism: "PLAIN", Password: "hunter2"}}, "username"},
	}
	for _, tc := range bad {
		_, err := New(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.has) || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: %v; want an error mentioning %q and not the password", tc.name, err, tc.has)
		}
	}
	// Nothing listens there: New neither waits nor fails; Close is safe twice.
	s, err := New(Config{Brokers: []string{"127.0.0.1:" + strconv.Itoa(freePort(t))}})
	if err != nil {
		t.Fatal(err)
	}
	if out := s.Send(context.Background(), batch()); len(out) != 0 {
		t.Errorf("empty batch: %d results", len(out))
	}
	want := dispatch.Capabilities{Ordering: "per partition (key = aggregate_id)"}
	if got := s.Capabilities(); got != want {
		t.Errorf("capabilities %+v, want %+v", got, want)
	}
	if err := errors.Join(s.Close(), s.Close()); err != nil {
		t.Errorf("close: %v", err)
	}
	out := s.Send(context.Background(), batch(event(1, "deal", "a")))
	if out[0].Outcome != dispatch.Retryable || !strings.Contains(fmt.Sprint(out[0].Err), "closed") {
		t.Errorf("send after close: %s %v; want Retryable, closed", out[0].Outcome, out[0].Err)
	}
}
