// Package sinktest is the conformance suite every sink passes: Run sends
// batches through a sink to a destination of the test's own and checks,
// against what the destination holds, the contract of dispatch.Sink and of
// docs/reference.md's message mapping:
//
//   - the events of one aggregate arrive in id order;
//   - an aggregate stops at its first failure (its later events are
//     NotAttempted) while the other aggregates are delivered;
//   - one result per event, aligned by index, successes of an aggregate a
//     prefix;
//   - the id header, the dedupe key, the ordering key and the mapping
//     headers (id, aggregate_type, aggregate_id, event_type, created_at,
//     fencing_token, the row's own headers), the payload as the body;
//   - a payload above the sink's limit is answered for its event alone,
//     and one below it is delivered, without stalling other aggregates;
//   - a cancelled context answers every event not delivered.
//
// A sink's harness (Target) says how to make its destination refuse one
// event and how to read back what it got.
package sinktest

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/dispatch"
)

// Token is the fencing token of every batch Run sends.
const Token = 7

// CreatedAt is every event's created_at, and CreatedAtText the header
// value it must become (RFC 3339, the microseconds kept).
var CreatedAt = time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)

// CreatedAtText is CreatedAt as the created_at header carries it.
const CreatedAtText = "2026-01-02T03:04:05.000006Z"

// EventType is every event's event_type, unless Target.Poison changes it.
const EventType = "order.changed"

// Message is one message as a consumer of the destination reads it.
type Message struct {
	// Headers are the contract's headers and the row's own, by name
	// (webhook: the envelope's fields, X-Fencing-Token as fencing_token
	// and the envelope's headers).
	Headers map[string]string
	// Body is the payload as the destination holds it.
	Body string
	// Key is the ordering key as the destination carries it (record key,
	// ordering key, partition key, group id, header).
	Key string
	// DedupeID is the key the destination drops a repeat by (Nats-Msg-Id,
	// MessageDeduplicationId, Idempotency-Key); "" where there is none.
	DedupeID string
}

// Target is one sink under test, sending to a destination of its own.
type Target struct {
	Sink dispatch.Sink
	// Read waits until the destination holds at least n messages (at most
	// a generous while, then fails t) and returns every message it holds.
	Read func(t *testing.T, n int) []Message
	// Poison changes ev, its aggregate kept, so that the sink answers it
	// Retryable or Permanent: an event_type the destination template
	// sends nowhere, a payload the destination refuses, a receiver that
	// answers 503.
	Poison func(ev *dispatch.Event)
	// Key is the ordering key ev must carry (Message.Key).
	Key func(ev dispatch.Event) string
	// DedupeID is the dedupe key ev must carry; nil where the destination
	// has none.
	DedupeID func(ev dispatch.Event) string
	// MaxPayload is the largest payload the sink sends; a larger one is
	// answered Permanent without stalling others. 0: no limit of the
	// sink's own below 1 MiB (Run then checks a 1 MiB payload is
	// delivered).
	MaxPayload int
}

// Run runs the suite against the targets setup returns, a new one (a new
// destination) per case.
func Run(t *testing.T, setup func(t *testing.T) Target) {
	for _, c := range []struct {
		name string
		run  func(t *testing.T, tg Target)
	}{
		{"OrderAndMapping", orderAndMapping},
		{"StopAtFirstFailure", stopAtFirstFailure},
		{"Oversize", oversize},
		{"ContextCancelled", contextCancelled},
	} {
		t.Run(c.name, func(t *testing.T) { c.run(t, setup(t)) })
	}
}

// Event is event id of aggregate order/agg, type EventType, payload
// {"n":id}, a traceparent row header and fingerprint "fp<id>".
func Event(id int64, agg string) dispatch.Event {
	return dispatch.Event{ID: id, AggregateType: "order", AggregateID: agg, EventType: EventType,
		Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, id)), Headers: json.RawMessage(`{"traceparent":"00-abc-def-01"}`),
		CreatedAt: CreatedAt, Fingerprint: fmt.Sprintf("fp%d", id)}
}

// Batch is events under Token with a trust deadline a minute away.
func Batch(events ...dispatch.Event) dispatch.Batch {
	until := time.Now().Add(time.Minute)
	return dispatch.Batch{Events: events, Token: Token, Until: func() time.Time { return until }}
}

// interleaved are n events of each of aggs, interleaved, ids from 1.
func interleaved(n int, aggs ...string) []dispatch.Event {
	var evs []dispatch.Event
	for range n {
		for _, a := range aggs {
			evs = append(evs, Event(int64(len(evs)+1), a))
		}
	}
	return evs
}

// send sends evs in one batch and checks one result per event and that
// each aggregate's successes are a prefix.
func send(t *testing.T, tg Target, ctx context.Context, evs []dispatch.Event) []dispatch.Result {
	t.Helper()
	out := tg.Sink.Send(ctx, Batch(evs...))
	if len(out) != len(evs) {
		t.Fatalf("%d results for %d events", len(out), len(evs))
	}
	failed := map[dispatch.Aggregate]int64{}
	for i, r := range out {
		a := evs[i].Aggregate()
		ok := r.Outcome == dispatch.Delivered || r.Outcome == dispatch.Duplicate
		if first, stopped := failed[a]; stopped && r.Outcome != dispatch.NotAttempted {
			t.Errorf("event %d: %s after event %d of its aggregate failed, want not attempted", evs[i].ID, r.Outcome, first)
		}
		if !ok {
			if _, stopped := failed[a]; !stopped {
				failed[a] = evs[i].ID
			}
		}
	}
	return out
}

// byID indexes messages by their id header (the first of each id).
func byID(t *testing.T, msgs []Message) map[int64]Message {
	t.Helper()
	out := map[int64]Message{}
	for _, m := range msgs {
		id, err := strconv.ParseInt(m.Headers["id"], 10, 64)
		if err != nil {
			t.Fatalf("message without a numeric id header: headers %v", m.Headers)
		}
		if _, ok := out[id]; !ok {
			out[id] = m
		}
	}
	return out
}

// orderAndMapping: 12 events over 3 aggregates, all delivered; each
// aggregate's events arrive in id order; each message carries the
// contract's headers, its ordering key, its dedupe key and the payload as
// its body.
func orderAndMapping(t *testing.T, tg Target) {
	evs := interleaved(4, "a", "b", "c")
	for i, r := range send(t, tg, t.Context(), evs) {
		if r.Outcome != dispatch.Delivered {
			t.Fatalf("event %d: %s (%v), want delivered", evs[i].ID, r.Outcome, r.Err)
		}
	}
	msgs := tg.Read(t, len(evs))
	order := map[string][]int64{}
	seen := map[int64]bool{}
	for _, m := range msgs {
		id, _ := strconv.ParseInt(m.Headers["id"], 10, 64)
		if id < 1 || id > int64(len(evs)) {
			t.Fatalf("message with id header %q: not an event sent", m.Headers["id"])
		}
		if !seen[id] {
			seen[id] = true
			order[m.Headers["aggregate_id"]] = append(order[m.Headers["aggregate_id"]], id)
		}
		checkMapping(t, tg, evs[id-1], m)
	}
	for _, a := range []string{"a", "b", "c"} {
		var want []int64
		for _, ev := range evs {
			if ev.AggregateID == a {
				want = append(want, ev.ID)
			}
		}
		if fmt.Sprint(order[a]) != fmt.Sprint(want) {
			t.Errorf("aggregate %s arrived as %v, want %v", a, order[a], want)
		}
	}
}

// checkMapping checks one message against its event.
func checkMapping(t *testing.T, tg Target, ev dispatch.Event, m Message) {
	t.Helper()
	want := map[string]string{"id": strconv.FormatInt(ev.ID, 10), "aggregate_type": ev.AggregateType,
		"aggregate_id": ev.AggregateID, "event_type": ev.EventType, "created_at": CreatedAtText,
		"fencing_token": strconv.Itoa(Token), "traceparent": "00-abc-def-01"}
	for k, v := range want {
		if m.Headers[k] != v {
			t.Errorf("event %d: header %s = %q, want %q (headers %v)", ev.ID, k, m.Headers[k], v, m.Headers)
		}
	}
	if m.Body != string(ev.Payload) {
		t.Errorf("event %d: body %q, want the payload %q as is", ev.ID, m.Body, ev.Payload)
	}
	if k := tg.Key(ev); m.Key != k {
		t.Errorf("event %d: ordering key %q, want %q", ev.ID, m.Key, k)
	}
	if tg.DedupeID != nil && m.DedupeID != tg.DedupeID(ev) {
		t.Errorf("event %d: dedupe key %q, want %q", ev.ID, m.DedupeID, tg.DedupeID(ev))
	}
}

// stopAtFirstFailure: aggregate a's second event is refused: a's first is
// delivered, its second failed, its third and fourth not attempted; b and
// c are delivered in full, and the destination holds each of their events.
func stopAtFirstFailure(t *testing.T, tg Target) {
	evs := interleaved(4, "a", "b", "c") // a: 1 4 7 10
	tg.Poison(&evs[3])
	out := send(t, tg, t.Context(), evs)
	delivered := 0
	for i, r := range out {
		want := "delivered"
		switch evs[i].ID {
		case 4:
			want = "failed"
		case 7, 10:
			want = "not attempted"
		}
		got := r.Outcome.String()
		if r.Outcome == dispatch.Retryable || r.Outcome == dispatch.Permanent {
			got = "failed"
		}
		if got != want {
			t.Errorf("event %d (aggregate %s): %s (%v), want %s", evs[i].ID, evs[i].AggregateID, r.Outcome, r.Err, want)
		}
		if r.Outcome == dispatch.Delivered {
			delivered++
		}
	}
	got := byID(t, tg.Read(t, delivered))
	for i, r := range out {
		if _, ok := got[evs[i].ID]; r.Outcome == dispatch.Delivered && !ok {
			t.Errorf("event %d answered delivered, the destination does not hold it", evs[i].ID)
		}
	}
}

// oversize: aggregate a's first event has a payload above the sink's
// limit (answered Permanent, a's next not attempted, the rest delivered),
// or, for a sink without one, a payload of 1 MiB (delivered).
func oversize(t *testing.T, tg Target) {
	evs := interleaved(2, "a", "b") // a: 1 3
	size := 1 << 20
	if tg.MaxPayload > 0 {
		size = tg.MaxPayload + 1
	}
	evs[0].Payload = json.RawMessage(`"` + strings.Repeat("x", size-2) + `"`)
	out := send(t, tg, t.Context(), evs)
	want := []dispatch.Outcome{dispatch.Delivered, dispatch.Delivered, dispatch.Delivered, dispatch.Delivered}
	if tg.MaxPayload > 0 {
		want[0], want[2] = dispatch.Permanent, dispatch.NotAttempted
	}
	delivered := 0
	for i, r := range out {
		if r.Outcome != want[i] {
			t.Errorf("event %d (payload %d bytes): %s (%v), want %s", evs[i].ID, len(evs[i].Payload), r.Outcome, r.Err, want[i])
		}
		if r.Outcome == dispatch.Delivered {
			delivered++
		}
	}
	got := byID(t, tg.Read(t, delivered))
	if m, ok := got[1]; ok && tg.MaxPayload == 0 && len(m.Body) != size {
		t.Errorf("event 1: body of %d bytes, want %d", len(m.Body), size)
	}
}

// contextCancelled: a Send with its context already cancelled returns
// with every event not delivered, and sends nothing.
func contextCancelled(t *testing.T, tg Target) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	evs := interleaved(2, "a", "b")
	for i, r := range send(t, tg, ctx, evs) {
		if r.Outcome == dispatch.Delivered || r.Outcome == dispatch.Duplicate {
			t.Errorf("event %d: %s after the context was cancelled", evs[i].ID, r.Outcome)
		}
	}
	// What a cancelled Send sent, if anything, would be there by now: the
	// sink has returned. A batch sent afterwards must be the only one held.
	later := []dispatch.Event{Event(100, "z")}
	if r := send(t, tg, t.Context(), later); r[0].Outcome != dispatch.Delivered {
		t.Fatalf("event 100: %s (%v), want delivered", r[0].Outcome, r[0].Err)
	}
	if got := byID(t, tg.Read(t, 1)); len(got) != 1 {
		t.Errorf("the destination holds events %v, want only 100", keys(got))
	}
}

func keys(m map[int64]Message) []int64 {
	var out []int64
	for k := range m {
		out = append(out, k)
	}
	return out
}
