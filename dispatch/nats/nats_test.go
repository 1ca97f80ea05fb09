package nats

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/dispatch/internal/sinktest"
	"github.com/outboxd/outboxd/internal/cetest"
	"github.com/outboxd/outboxd/internal/testkit"
)

// TestMapping: one message per event on the template's subject, the
// payload bytes as is, the contract's headers, the row's headers passed
// through unless they collide or NATS must not carry them, Nats-Msg-Id =
// "<outbox id>:<fingerprint>", CloudEvents attributes only when enabled.
func TestMapping(t *testing.T) {
	t.Parallel()
	for _, ce := range []bool{false, true} {
		t.Run(fmt.Sprintf("cloudevents=%v", ce), func(t *testing.T) {
			t.Parallel()
			ts := newStream(t, sharedURL, nil)
			s, logs := newSink(t, Config{URL: sharedURL, Subject: ts.prefix + ".{aggregate_type}.{event_type}",
				CloudEvents: dispatch.CloudEvents{Enabled: ce, Source: "test-source"}})
			ev := event(41, "order", "o-1")
			ev.Fingerprint = "hogob5ml4w.e345fcd3.c73436916fc1b368"
			ev.Payload = json.RawMessage(`{"b": 1,   "a": [1, 2], "u": "\u00e9"}`) // spacing and escapes kept
			ev.Headers = json.RawMessage(`{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
				"n": 5, "Aggregate_ID": "evil", "id": "999", "ce-id": "evil-ce",
				"Nats-Msg-Id": "1", "Nats-Rollup": "all", "bad:name": "x", "Status": "404", "note": "see Nats-Msg-Id"}`)

			rs := s.Send(t.Context(), batch(ev))
			wantOutcomes(t, rs, dispatch.Delivered)
			if want := ts.name + "#1"; rs[0].Ref != want {
				t.Errorf("Ref = %q, want %q", rs[0].Ref, want)
			}
			msgs := ts.messages(t)
			if len(msgs) != 1 {
				t.Fatalf("stream holds %d messages, want 1", len(msgs))
			}
			m := msgs[0]
			if want := ts.prefix + ".order.order.happened"; m.Subject != want {
				t.Errorf("subject %q, want %q", m.Subject, want)
			}
			if string(m.Data) != string(ev.Payload) {
				t.Errorf("body %q, want the payload as is %q", m.Data, ev.Payload)
			}
			want := map[string]string{
				"id": "41", "aggregate_type": "order", "aggregate_id": "o-1", "event_type": "order.happened",
				"created_at": created.Format(time.RFC3339Nano), "fencing_token": "7",
				"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "n": "5",
				"Nats-Msg-Id": "41:hogob5ml4w.e345fcd3.c73436916fc1b368",
			}
			if ce {
				for k, v := range map[string]string{"ce-specversion": "1.0", "ce-id": "41", "ce-source": "test-source",
					"ce-type": "order.happened", "ce-time": created.Format(time.RFC3339Nano), "ce-aggregatetype": "order",
					"ce-aggregateid": "o-1", "ce-datacontenttype": "application/json"} {
					want[k] = v
				}
			} else {
				want["ce-id"] = "evil-ce" // without CloudEvents it is just a row header
			}
			got := map[string]string{}
			for k, vs := range m.Header {
				if len(vs) != 1 {
					t.Errorf("header %s has %d values %q, want 1", k, len(vs), vs)
				}
				got[k] = vs[0]
			}
			for k, v := range want {
				if got[k] != v {
					t.Errorf("header %s = %q, want %q", k, got[k], v)
				}
			}
			for k := range got {
				if _, ok := want[k]; !ok {
					t.Errorf("unexpected header %s: %q", k, got[k])
				}
			}
			// One warning for the batch, naming the event and what was left out.
			line := logs.WaitLine(t, waitLimit, "row headers dropped")
			for _, name := range []string{`"outbox_id":41`, `"level":"WARN"`, "Aggregate_ID", "Nats-Msg-Id", "Nats-Rollup", "bad:name", "Status", "note"} {
				if !strings.Contains(line, name) {
					t.Errorf("drop warning lacks %s: %s", name, line)
				}
			}
		})
	}
}

// TestCloudEventsDecodeWithTheSDK: in both modes the message JetStream
// stored decodes, as the NATS binding defines it (ce- headers
// percent-encoded; Content-Type application/cloudevents+json marks
// structured mode), with the CloudEvents SDK to the row's event, values a
// header cannot carry as they are included.
func TestCloudEventsDecodeWithTheSDK(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{dispatch.CloudEventsBinary, dispatch.CloudEventsStructured} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			ts := newStream(t, sharedURL, nil)
			s, _ := newSink(t, Config{URL: sharedURL, Subject: ts.prefix + ".{aggregate_type}",
				CloudEvents: dispatch.CloudEvents{Enabled: true, Source: "urn:billing eu", Mode: mode}})
			ev := event(42, "order", `o "1" 100%`)
			ev.EventType = "order placed €"
			wantOutcomes(t, s.Send(t.Context(), batch(ev)), dispatch.Delivered)
			m := ts.messages(t)[0]
			h := map[string]string{}
			for k := range m.Header {
				h[k] = m.Header.Get(k)
			}
			got, err := cetest.Decode(cetest.Message{Prefix: "ce-", PercentDecode: true,
				ContentType: m.Header.Get("Content-Type"), Headers: h, Body: m.Data})
			if err != nil {
				t.Fatalf("the SDK cannot decode %v / %s: %v", h, m.Data, err)
			}
			if err := cetest.Check(got, cetest.Want{ID: 42, Source: "urn:billing eu", Type: ev.EventType,
				Time: created, AggregateType: "order", AggregateID: ev.AggregateID, Data: string(ev.Payload)}); err != nil {
				t.Errorf("decoded %s\n%v", got, err)
			}
			if h["id"] != "42" || h["aggregate_id"] != ev.AggregateID || h["Nats-Msg-Id"] != "42" {
				t.Errorf("the contract's headers are kept in every mode: %v", h)
			}
		})
	}
}

// TestResultsAndDuplicates: one result per event aligned by index, Ref the
// stream and sequence of its PubAck; the same events again within the
// stream's duplicate window are Duplicate (same Ref), and the window is
// known from the start (the template's stream, looked up by New).
func TestResultsAndDuplicates(t *testing.T) {
	t.Parallel()
	ts := newStream(t, sharedURL, func(c *jetstream.StreamConfig) { c.Duplicates = 5 * time.Minute })
	s, _ := newSink(t, Config{URL: sharedURL, Subject: ts.prefix + ".{aggregate_type}"})
	// New waits up to startProbe for the lookup; on a loaded machine it may
	// finish just after, so wait rather than fail on a slow probe.
	testkit.WaitFor(t, waitLimit, "the template's stream window", func() bool { return s.Capabilities().DedupeWindow == 5*time.Minute },
		func() string { return fmt.Sprintf("%+v", s.Capabilities()) })
	if got := s.Capabilities(); got.Ordering != "per subject (one stream)" || got.MaxBatch != 0 {
		t.Errorf("Capabilities() = %+v, want per subject ordering, no batch limit", got)
	}
	evs := []dispatch.Event{event(1, "a", "1"), event(2, "b", "1"), event(3, "a", "1"), event(4, "c", "9"), event(5, "b", "1")}
	rs := s.Send(t.Context(), batch(evs...))
	wantOutcomes(t, rs, dispatch.Delivered, dispatch.Delivered, dispatch.Delivered, dispatch.Delivered, dispatch.Delivered)
	for i, r := range rs {
		if want := ts.name + "#" + strconv.Itoa(i+1); r.Ref != want {
			t.Errorf("result %d Ref %q, want %q (published in batch order)", i, r.Ref, want)
		}
	}
	var ids []string
	for _, m := range ts.messages(t) {
		ids = append(ids, m.Header.Get("id"))
	}
	if want := []string{"1", "2", "3", "4", "5"}; !slices.Equal(ids, want) {
		t.Errorf("stream order %v, want %v", ids, want)
	}

	again := s.Send(t.Context(), batch(evs...))
	wantOutcomes(t, again, dispatch.Duplicate, dispatch.Duplicate, dispatch.Duplicate, dispatch.Duplicate, dispatch.Duplicate)
	for i := range again {
		if again[i].Ref != rs[i].Ref {
			t.Errorf("duplicate %d Ref %q, want the original's %q", i, again[i].Ref, rs[i].Ref)
		}
	}
	mixed := s.Send(t.Context(), batch(event(3, "a", "1"), event(6, "a", "1")))
	wantOutcomes(t, mixed, dispatch.Duplicate, dispatch.Delivered)
	if n := ts.count(t); n != 6 {
		t.Errorf("stream holds %d messages, want 6 (duplicates dropped)", n)
	}
}

// TestRewindWithinTheWindowIsNotADuplicate: rows that reuse the ids of
// rows sent a moment before (a sequence rewind, a re-import with the same
// created_at and names and new payloads) have other fingerprints, so the
// stream stores every one of them, well inside its duplicate window; the
// same row sent twice is still stored once.
func TestRewindWithinTheWindowIsNotADuplicate(t *testing.T) {
	t.Parallel()
	ts := newStream(t, sharedURL, func(c *jetstream.StreamConfig) { c.Duplicates = 5 * time.Minute })
	s, _ := newSink(t, Config{URL: sharedURL, Subject: ts.prefix + ".{aggregate_type}"})
	first, second := sinktest.Generation("a", 1), sinktest.Generation("a", 2)
	wantOutcomes(t, s.Send(t.Context(), batch(first...)), dispatch.Delivered, dispatch.Delivered, dispatch.Delivered)
	wantOutcomes(t, s.Send(t.Context(), batch(second...)), dispatch.Delivered, dispatch.Delivered, dispatch.Delivered)
	wantOutcomes(t, s.Send(t.Context(), batch(second...)), dispatch.Duplicate, dispatch.Duplicate, dispatch.Duplicate)
	var got []string
	for _, m := range ts.messages(t) {
		got = append(got, string(m.Data))
	}
	if want := sinktest.Payloads(first, second); !slices.Equal(got, want) {
		t.Errorf("stream holds %v, want each row of both generations once: %v", got, want)
	}
}

// TestNoStream: a subject no stream captures is Retryable, naming the
// subject and what to do; the aggregate's later events are NotAttempted.
func TestNoStream(t *testing.T) {
	t.Parallel()
	prefix := "u" + randomID() // no stream captures it
	s, logs := newSink(t, Config{URL: sharedURL, Subject: prefix + ".{aggregate_type}"})
	logs.WaitLine(t, waitLimit, "no JetStream stream captures the template's sample subject")
	rs := s.Send(t.Context(), batch(event(1, "a", "1"), event(2, "a", "1"), event(3, "b", "1")))
	wantOutcomes(t, rs, dispatch.Retryable, dispatch.NotAttempted, dispatch.Retryable)
	for _, i := range []int{0, 2} {
		msg := rs[i].Err.Error()
		subj := prefix + "." + []string{"a", "", "b"}[i]
		if rs[i].Cut || !strings.Contains(msg, strconv.Quote(subj)) || !strings.Contains(msg, "add the subject to a stream") {
			t.Errorf("result %d: cut %v, error %q; want not cut, naming %q and saying to add it to a stream", i, rs[i].Cut, msg, subj)
		}
	}

	// A literal subject (no placeholders) is checked at start: a warning.
	_, logs2 := newSink(t, Config{URL: sharedURL, Subject: prefix + ".fixed"})
	if line := logs2.WaitLine(t, waitLimit, "no JetStream stream captures the subject"); !strings.Contains(line, `"level":"WARN"`) {
		t.Errorf("want a WARN at start for a literal subject no stream captures: %s", line)
	}
}

// TestAboveMaxPayload: a message above the server's max_payload is
// Permanent and never sent; its aggregate's later events are NotAttempted
// (and not sent either); other aggregates are unaffected.
func TestAboveMaxPayload(t *testing.T) {
	t.Parallel()
	ts := newStream(t, sharedURL, nil)
	s, _ := newSink(t, Config{URL: sharedURL, Subject: ts.prefix + ".{aggregate_type}"})
	big := event(2, "a", "1")
	big.Payload = json.RawMessage(`"` + strings.Repeat("x", 1<<20) + `"`) // above the default 1 MiB
	rs := s.Send(t.Context(), batch(event(1, "a", "1"), big, event(3, "a", "1"), event(4, "b", "1"), event(5, "b", "1")))
	wantOutcomes(t, rs, dispatch.Delivered, dispatch.Permanent, dispatch.NotAttempted, dispatch.Delivered, dispatch.Delivered)
	if msg := rs[1].Err.Error(); !strings.Contains(msg, "max_payload") || !strings.Contains(msg, strconv.Quote(ts.prefix+".a")) {
		t.Errorf("error %q should name max_payload and the subject", msg)
	}
	var ids []string
	for _, m := range ts.messages(t) {
		ids = append(ids, m.Header.Get("Nats-Msg-Id"))
	}
	if want := []string{"1", "4", "5"}; !slices.Equal(ids, want) {
		t.Errorf("stream holds %v, want %v (nothing after the failure of aggregate a)", ids, want)
	}
}

// TestAboveStreamMaxMsgSize: the stream refuses a message above its
// max_msg_size (Permanent). The aggregate's next event, already in flight,
// is stored but reported NotAttempted: successes are a prefix.
func TestAboveStreamMaxMsgSize(t *testing.T) {
	t.Parallel()
	ts := newStream(t, sharedURL, func(c *jetstream.StreamConfig) { c.MaxMsgSize = 1000 })
	s, _ := newSink(t, Config{URL: sharedURL, Subject: ts.prefix + ".{aggregate_type}"})
	big := event(2, "a", "1")
	big.Payload = json.RawMessage(`"` + strings.Repeat("x", 2000) + `"`)
	rs := s.Send(t.Context(), batch(event(1, "a", "1"), big, event(3, "a", "1"), event(4, "b", "1")))
	wantOutcomes(t, rs, dispatch.Delivered, dispatch.Permanent, dispatch.NotAttempted, dispatch.Delivered)
	if msg := rs[1].Err.Error(); !strings.Contains(msg, "max_msg_size") {
		t.Errorf("error %q should name max_msg_size", msg)
	}
	if n := ts.count(t); n != 3 {
		t.Errorf("stream holds %d messages, want 3 (event 3 stored though reported NotAttempted)", n)
	}
}

// TestStreamFull: a stream at max_msgs with discard new refuses more:
// Retryable with the server's reason; delivered events stay delivered.
func TestStreamFull(t *testing.T) {
	t.Parallel()
	ts := newStream(t, sharedURL, func(c *jetstream.StreamConfig) { c.MaxMsgs, c.Discard = 3, jetstream.DiscardNew })
	s, _ := newSink(t, Config{URL: sharedURL, Subject: ts.prefix + ".{aggregate_type}"})
	rs := s.Send(t.Context(), batch(event(1, "a", "1"), event(2, "b", "1"), event(3, "a", "1"), event(4, "b", "1"), event(5, "a", "1")))
	wantOutcomes(t, rs, dispatch.Delivered, dispatch.Delivered, dispatch.Delivered, dispatch.Retryable, dispatch.Retryable)
	for _, r := range rs[3:] {
		if msg := r.Err.Error(); r.Cut || !strings.Contains(msg, "maximum messages exceeded") || !strings.Contains(msg, "the stream is full") {
			t.Errorf("cut %v, error %q: want the server's reason and a hint", r.Cut, msg)
		}
	}
}

// TestDeadlinePassed: a batch whose trust deadline has passed, or whose
// context is done, publishes nothing.
func TestDeadlinePassed(t *testing.T) {
	t.Parallel()
	ts := newStream(t, sharedURL, nil)
	s, _ := newSink(t, Config{URL: sharedURL, Subject: ts.prefix + ".{aggregate_type}"})
	b := batch(event(1, "a", "1"), event(2, "b", "1"))
	b.Until = func() time.Time { return time.Now().Add(-time.Second) }
	wantOutcomes(t, s.Send(t.Context(), b), dispatch.NotAttempted, dispatch.NotAttempted)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	wantOutcomes(t, s.Send(ctx, batch(event(1, "a", "1"))), dispatch.NotAttempted)
	// A later batch goes through: nothing of the above was sent.
	wantOutcomes(t, s.Send(t.Context(), batch(event(3, "c", "1"))), dispatch.Delivered)
	if ids := ts.messages(t); len(ids) != 1 || ids[0].Header.Get("id") != "3" {
		t.Errorf("stream holds %d messages, want only event 3", len(ids))
	}
}

// TestDeadlineMidSend: the server stops answering (paused); publishes in
// flight when the deadline passes are Retryable and Cut, the ones not yet
// published (waiting for a free slot) stay NotAttempted and are never sent.
func TestDeadlineMidSend(t *testing.T) {
	t.Parallel()
	srv := newServer(t, "")
	srv.start()
	ts := newStream(t, srv.URL(), nil)
	s, _ := newSink(t, Config{URL: srv.URL(), Subject: ts.prefix + ".{aggregate_type}", maxPending: 3})
	wantOutcomes(t, s.Send(t.Context(), batch(event(100, "z", "1"))), dispatch.Delivered) // connected

	srv.pause()
	b := batch(event(1, "a", "1"), event(2, "b", "1"), event(3, "c", "1"), event(4, "d", "1"), event(5, "a", "1"), event(6, "e", "1"))
	until := time.Now().Add(300 * time.Millisecond)
	b.Until = func() time.Time { return until }
	rs := s.Send(t.Context(), b)
	srv.resume()
	wantOutcomes(t, rs, dispatch.Retryable, dispatch.Retryable, dispatch.Retryable,
		dispatch.NotAttempted, dispatch.NotAttempted, dispatch.NotAttempted)
	for _, r := range rs[:3] {
		if !r.Cut || !errors.Is(r.Err, context.DeadlineExceeded) {
			t.Errorf("in-flight publish: cut %v, error %v; want Cut by the deadline", r.Cut, r.Err)
		}
	}
	// The three in flight reach the stream once the server runs again; the
	// others were never handed to the connection.
	testkit.WaitFor(t, waitLimit, "the in-flight messages stored", func() bool { return ts.count(t) >= 4 }, nil)
	var ids []string
	for _, m := range ts.messages(t) {
		ids = append(ids, m.Header.Get("id"))
	}
	if want := []string{"100", "1", "2", "3"}; !slices.Equal(ids, want) {
		t.Errorf("stream holds %v, want %v", ids, want)
	}
}

// TestServerDownAtStart: New succeeds without a server; Send is Retryable
// (first event of each aggregate, saying what is wrong); once a server
// answers, the same sink delivers.
func TestServerDownAtStart(t *testing.T) {
	t.Parallel()
	srv := newServer(t, "")
	s, _ := newSink(t, Config{URL: srv.URL(), Subject: "down.{aggregate_type}"})
	if w := s.Capabilities().DedupeWindow; w != 0 {
		t.Errorf("DedupeWindow %v before any server answered, want 0", w)
	}
	rs := s.Send(t.Context(), batch(event(1, "a", "1"), event(2, "a", "1"), event(3, "b", "1")))
	wantOutcomes(t, rs, dispatch.Retryable, dispatch.NotAttempted, dispatch.Retryable)
	if r := rs[0]; r.Cut || !strings.Contains(r.Err.Error(), "not connected to "+srv.URL()) {
		t.Errorf("cut %v, error %v; want not cut, saying it is not connected to %s", r.Cut, r.Err, srv.URL())
	}

	srv.start()
	ts := newStream(t, srv.URL(), func(c *jetstream.StreamConfig) { c.Subjects = []string{"down.>"} })
	testkit.WaitFor(t, waitLimit, "the sink to deliver once the server is up", func() bool {
		rs = s.Send(t.Context(), batch(event(1, "a", "1"), event(2, "a", "1"), event(3, "b", "1")))
		return !slices.Contains(outcomes(rs), "retryable") && !slices.Contains(outcomes(rs), "not attempted")
	}, func() string { return describe(rs) })
	if n := ts.count(t); n != 3 {
		t.Errorf("stream holds %d messages, want 3", n)
	}
}

// TestServerGoesAwayAndReturns: a server that stops makes Send Retryable;
// when it is back (same store), the same sink delivers again, and the
// stream's duplicate window survived the restart.
func TestServerGoesAwayAndReturns(t *testing.T) {
	t.Parallel()
	srv := newServer(t, "")
	srv.start()
	ts := newStream(t, srv.URL(), func(c *jetstream.StreamConfig) { c.Storage = jetstream.FileStorage })
	s, _ := newSink(t, Config{URL: srv.URL(), Subject: ts.prefix + ".{aggregate_type}"})
	wantOutcomes(t, s.Send(t.Context(), batch(event(1, "a", "1"))), dispatch.Delivered)

	srv.stop()
	rs := s.Send(t.Context(), batch(event(2, "a", "1")))
	wantOutcomes(t, rs, dispatch.Retryable)
	t.Logf("while down: %v", rs[0].Err)

	srv.start()
	testkit.WaitFor(t, waitLimit, "the sink to deliver after the restart", func() bool {
		rs = s.Send(t.Context(), batch(event(2, "a", "1")))
		return rs[0].Outcome == dispatch.Delivered
	}, func() string { return describe(rs) })
	wantOutcomes(t, s.Send(t.Context(), batch(event(1, "a", "1"))), dispatch.Duplicate)
	if n := ts.count(t); n != 2 {
		t.Errorf("stream holds %d messages, want 2", n)
	}
}

// TestPublishRefused: a publish the server's permissions refuse gets no
// ack; the sink reports it Retryable at once (not at the deadline), naming
// the subject, and the URL's password appears nowhere.
func TestPublishRefused(t *testing.T) {
	t.Parallel()
	denied := "denied" + randomID()
	srv := newServer(t, `authorization { users = [
		{user: "outboxd", password: "s3cret-pw", permissions: {publish: {deny: ["`+denied+`.>"]}}}
	] }`)
	srv.start()
	url := "nats://outboxd:s3cret-pw@127.0.0.1:" + strconv.Itoa(srv.port)
	ts := newStream(t, url, func(c *jetstream.StreamConfig) { c.Subjects = append(c.Subjects, denied+".>") })
	s, logs := newSink(t, Config{URL: url, Subject: "{aggregate_type}.evt"})
	b := batch(event(1, ts.prefix, "1"), event(2, denied, "1"), event(3, ts.prefix, "2"))
	rs := s.Send(t.Context(), b)
	wantOutcomes(t, rs, dispatch.Delivered, dispatch.Retryable, dispatch.Delivered)
	if r := rs[1]; r.Cut || !strings.Contains(r.Err.Error(), "permissions") || !strings.Contains(r.Err.Error(), strconv.Quote(denied+".evt")) {
		t.Errorf("cut %v, error %v: want a permissions error naming the subject", r.Cut, r.Err)
	}
	for _, r := range rs {
		if r.Err != nil && strings.Contains(r.Err.Error(), "s3cret-pw") {
			t.Errorf("error shows the password: %v", r.Err)
		}
	}
	if strings.Contains(logs.String(), "s3cret-pw") {
		t.Errorf("logs show the password:\n%s", logs.String())
	}
}

// TestWindowLearnedAtFirstUse: when the template's sample subject is not
// captured, the window is learned from the first PubAck's stream, and a
// window shorter than the retry horizon is logged at WARN.
func TestWindowLearnedAtFirstUse(t *testing.T) {
	t.Parallel()
	ts := newStream(t, sharedURL, func(c *jetstream.StreamConfig) {
		c.Subjects, c.Duplicates = []string{strings.TrimSuffix(c.Subjects[0], ">") + "order"}, 30*time.Second
	})
	s, logs := newSink(t, Config{URL: sharedURL, Subject: ts.prefix + ".{aggregate_type}", RetryHorizon: time.Hour})
	if w := s.Capabilities().DedupeWindow; w != 0 {
		t.Errorf("DedupeWindow %v at start, want 0 (no stream captures the sample subject)", w)
	}
	wantOutcomes(t, s.Send(t.Context(), batch(event(1, "order", "1"))), dispatch.Delivered)
	testkit.WaitFor(t, waitLimit, "the window learned", func() bool { return s.Capabilities().DedupeWindow == 30*time.Second },
		func() string { return logs.Tail(10) })
	line := logs.WaitLine(t, waitLimit, "duplicate window is shorter than the retry horizon")
	if !strings.Contains(line, `"level":"WARN"`) || !strings.Contains(line, ts.name) {
		t.Errorf("want a WARN naming stream %s: %s", ts.name, line)
	}
}

// TestNew: a config that cannot work fails New with a message naming what
// is wrong and never the password; a sink whose server never answered
// closes cleanly, twice, and refuses sends after.
func TestNew(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	notCreds := filepath.Join(dir, "x.creds")
	if err := os.WriteFile(notCreds, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"unknown placeholder", Config{Subject: "x.{nope}"}, "unknown placeholder"},
		{"space in subject", Config{Subject: "bad subject.{aggregate_type}"}, "whitespace"},
		{"wildcard", Config{Subject: "a.*.{aggregate_type}"}, "wildcard"},
		{"empty token", Config{Subject: "a..{aggregate_type}"}, "empty token"},
		{"scheme", Config{URL: "http://127.0.0.1:4222"}, "want scheme nats"},
		{"unparsable", Config{URL: "nats://user:p%zz@127.0.0.1:4222"}, "cannot be parsed"},
		{"no host", Config{URL: "nats://"}, "no host"},
		{"missing creds", Config{CredsFile: filepath.Join(dir, "missing.creds")}, "creds_file"},
		{"not creds", Config{CredsFile: notCreds}, "not a NATS credentials file"},
	} {
		_, err := New(c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: New error %v, want one containing %q", c.name, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "p%zz") {
			t.Errorf("%s: error shows the password: %v", c.name, err)
		}
	}

	s, err := New(Config{URL: "nats://127.0.0.1:" + strconv.Itoa(freePort(t))})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	rs := s.Send(t.Context(), batch(event(1, "a", "1")))
	wantOutcomes(t, rs, dispatch.Retryable)
	if !errors.Is(rs[0].Err, errClosed) {
		t.Errorf("Send after Close: %v, want errClosed", rs[0].Err)
	}
}

// BenchmarkSend10k publishes 10,000 events in batches of 500 (50
// aggregates) to a file stream on the local server and reports events/s.
func BenchmarkSend10k(b *testing.B) {
	id := randomID()
	js := jetStreamOf(b, sharedURL)
	name := "B" + strings.ToUpper(id)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{"b" + id + ".>"}}); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = js.DeleteStream(context.WithoutCancel(ctx), name) }()
	s, err := New(Config{URL: sharedURL, Subject: "b" + id + ".{aggregate_type}"})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	next := int64(1)
	b.ResetTimer()
	for range b.N {
		for range 20 {
			evs := make([]dispatch.Event, 500)
			for j := range evs {
				evs[j] = event(next, "agg", strconv.Itoa(j%50))
				next++
			}
			for i, r := range s.Send(ctx, batch(evs...)) {
				if r.Outcome != dispatch.Delivered {
					b.Fatalf("event %d: %s %v", i, r.Outcome, r.Err)
				}
			}
		}
	}
	b.ReportMetric(float64(b.N*10000)/b.Elapsed().Seconds(), "events/s")
}

// TestInvalidSubjectFromRow: a row whose values make an invalid subject
// is Permanent (retrying the same row cannot help), naming the subject.
func TestInvalidSubjectFromRow(t *testing.T) {
	t.Parallel()
	ts := newStream(t, sharedURL, nil)
	s, _ := newSink(t, Config{URL: sharedURL, Subject: ts.prefix + ".{aggregate_type}"})
	// A subject above the server's control line would make it close the
	// connection, cutting every aggregate's publishes: refused before.
	long := strings.Repeat("l", 5000)
	rs := s.Send(t.Context(), batch(event(1, "bad type", "1"), event(2, "bad type", "1"), event(3, "", "1"),
		event(4, long, "1"), event(5, "ok", "1")))
	wantOutcomes(t, rs, dispatch.Permanent, dispatch.NotAttempted, dispatch.Permanent, dispatch.Permanent, dispatch.Delivered)
	for _, c := range []struct {
		i    int
		want string
	}{{0, `"` + ts.prefix + `.bad type" contains whitespace`}, {2, "empty token"}, {3, "is 5010 bytes long"}} {
		if msg := rs[c.i].Err.Error(); !strings.Contains(msg, c.want) {
			t.Errorf("result %d: %q, want it to contain %q", c.i, msg, c.want)
		}
	}
}

// TestSilentServer: a server that accepts connections but never speaks
// does not hold New (beyond its start-up probe); Send is Retryable, and
// Close returns while the connection is half made.
func TestSilentServer(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // held open, never answered
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
	})
	s, logs := newSink(t, Config{URL: "nats://" + ln.Addr().String()})
	logs.WaitLine(t, waitLimit, "no answer from the server within the start-up probe")
	rs := s.Send(t.Context(), batch(event(1, "a", "1")))
	wantOutcomes(t, rs, dispatch.Retryable)
	if msg := rs[0].Err.Error(); !strings.Contains(msg, "connect") || !strings.Contains(msg, ln.Addr().String()) {
		t.Errorf("error %q should say it is (still) connecting to %s", msg, ln.Addr())
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestConnectionClosedByServer: a server that closes the connection for
// good (here: an -ERR for a protocol line above its max_control_line,
// lowered to 512 bytes) fails the publishes awaiting a PubAck at once; the
// sink makes a new connection by itself and delivers again.
func TestConnectionClosedByServer(t *testing.T) {
	t.Parallel()
	srv := newServer(t, "max_control_line: 512")
	srv.start()
	ts := newStream(t, srv.URL(), nil)
	s, logs := newSink(t, Config{URL: srv.URL(), Subject: ts.prefix + ".{aggregate_type}"})
	long := strings.Repeat("l", 600)
	rs := s.Send(t.Context(), batch(event(1, long, "1")))
	wantOutcomes(t, rs, dispatch.Retryable)
	if rs[0].Cut || !strings.Contains(rs[0].Err.Error(), "maximum control line exceeded") {
		t.Errorf("want the publish failed when the connection closed, with the server's reason: cut %v, %v", rs[0].Cut, rs[0].Err)
	}
	t.Log(rs[0].Err)
	logs.WaitLine(t, waitLimit, "the connection was closed; making a new one")
	testkit.WaitFor(t, waitLimit, "a delivery on a new connection", func() bool {
		rs = s.Send(t.Context(), batch(event(2, "a", "1")))
		return rs[0].Outcome == dispatch.Delivered
	}, func() string { return describe(rs) + logs.Tail(5) })
}

// TestWithoutStreamAPIPermissions: a user allowed only to publish on the
// subjects (and to receive PubAcks) is enough: events are delivered; the
// duplicate window stays unknown (0) and the start-up lookup says why.
func TestWithoutStreamAPIPermissions(t *testing.T) {
	t.Parallel()
	srv := newServer(t, `authorization { users = [
		{user: "admin", password: "a"},
		{user: "pub", password: "p", permissions: {publish: {allow: ["tt.>"]}, subscribe: {allow: ["_INBOX.>"]}}}
	] }`)
	srv.start()
	newStream(t, "nats://admin:a@127.0.0.1:"+strconv.Itoa(srv.port), func(c *jetstream.StreamConfig) { c.Subjects = []string{"tt.>"} })
	s, logs := newSink(t, Config{URL: "nats://pub:p@127.0.0.1:" + strconv.Itoa(srv.port), Subject: "tt.{aggregate_type}"})
	logs.WaitLine(t, waitLimit, "could not look up the template's stream at start")
	wantOutcomes(t, s.Send(t.Context(), batch(event(1, "a", "1"), event(2, "a", "1"))), dispatch.Delivered, dispatch.Delivered)
	if w := s.Capabilities().DedupeWindow; w != 0 {
		t.Errorf("DedupeWindow %v, want 0 (not readable)", w)
	}
}
