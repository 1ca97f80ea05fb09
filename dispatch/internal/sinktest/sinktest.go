// Package sinktest holds what the cloud sinks' tests share: a fixed event,
// a batch with a distant trust deadline, and the headers such an event must
// carry, written out by hand (not computed the way the sinks compute them).
package sinktest

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/outboxd/outboxd/dispatch"
)

// Token is the fencing token of Batch.
const Token = 7

// Event is event id of aggregate typ/agg, event type "<typ>.changed",
// created 2026-01-02T03:04:05.000006Z, with a traceparent row header. Its
// payload has a space after the colon, as Postgres renders jsonb, so a sink
// that re-encodes it shows.
func Event(id int64, typ, agg string) dispatch.Event {
	return dispatch.Event{ID: id, AggregateType: typ, AggregateID: agg, EventType: typ + ".changed",
		Payload: json.RawMessage(fmt.Sprintf(`{"n": %d}`, id)), Headers: json.RawMessage(`{"traceparent":"00-abc-def-01"}`),
		CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)}
}

// Generation is the rows 1, 2 and 3 of aggregates typ/0 and typ/1 as
// generation gen wrote them: payload {"gen": gen, "n": id}, and a
// fingerprint of the generation's own, as the ids of a rewound sequence
// (or a re-import with the same created_at and names) carry them.
func Generation(typ string, gen int) []dispatch.Event {
	var out []dispatch.Event
	for id := int64(1); id <= 3; id++ {
		ev := Event(id, typ, strconv.FormatInt(id%2, 10))
		ev.Payload = json.RawMessage(fmt.Sprintf(`{"gen": %d, "n": %d}`, gen, id))
		ev.Fingerprint = fmt.Sprintf("hogob5ml4w.e345fcd3.%016x", gen*10+int(id))
		out = append(out, ev)
	}
	return out
}

// Payloads are the payloads of every event of gens, sorted.
func Payloads(gens ...[]dispatch.Event) []string {
	var out []string
	for _, g := range gens {
		for _, ev := range g {
			out = append(out, string(ev.Payload))
		}
	}
	slices.Sort(out)
	return out
}

// Typed is Event(id, "order", agg) with event type typ, for a template
// that names its destination by {event_type}.
func Typed(id int64, agg, typ string) dispatch.Event {
	ev := Event(id, "order", agg)
	ev.EventType = typ
	return ev
}

// Batch is events under Token with a trust deadline a minute away.
func Batch(events ...dispatch.Event) dispatch.Batch {
	until := time.Now().Add(time.Minute)
	return dispatch.Batch{Events: events, Token: Token, Until: func() time.Time { return until }}
}

// Outcomes are the results' outcomes.
func Outcomes(rs []dispatch.Result) []dispatch.Outcome {
	out := make([]dispatch.Outcome, len(rs))
	for i, r := range rs {
		out[i] = r.Outcome
	}
	return out
}

// Headers are the headers an Event sent in a Batch must carry, with the
// CloudEvents attributes under cePrefix ("" for none).
func Headers(ev dispatch.Event, cePrefix string) map[string]string {
	id := strconv.FormatInt(ev.ID, 10)
	h := map[string]string{"id": id, "aggregate_type": ev.AggregateType, "aggregate_id": ev.AggregateID,
		"event_type": ev.EventType, "created_at": "2026-01-02T03:04:05.000006Z", "fencing_token": "7",
		"traceparent": "00-abc-def-01"}
	if cePrefix != "" {
		for k, v := range map[string]string{"specversion": "1.0", "id": id, "source": "outboxd", "type": ev.EventType,
			"time": "2026-01-02T03:04:05.000006Z", "aggregatetype": ev.AggregateType, "aggregateid": ev.AggregateID} {
			h[cePrefix+k] = v
		}
	}
	return h
}

// BenchSend sends 10,000 events in batches of 1,000 over 1,000 aggregates
// of type typ (the bench drain's shape) per iteration, fails b on any
// event not Delivered, and reports events/s.
func BenchSend(b *testing.B, s dispatch.Sink, typ string) {
	const total, size = 10000, 1000
	events := make([]dispatch.Event, total)
	for i := range events {
		events[i] = Event(int64(i+1), typ, strconv.Itoa(i%1000))
	}
	b.ResetTimer()
	for b.Loop() {
		for off := 0; off < total; off += size {
			for i, r := range s.Send(b.Context(), Batch(events[off:off+size]...)) {
				if r.Outcome != dispatch.Delivered {
					b.Fatalf("event %d: %s %v", events[off+i].ID, r.Outcome, r.Err)
				}
			}
		}
	}
	b.ReportMetric(float64(total*b.N)/b.Elapsed().Seconds(), "events/s")
}
