package webhook

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/outboxd/outboxd/dispatch"
)

// The webhook body is the contract's envelope exactly as json.Marshal
// writes it: the hand-written fast path must not differ by a byte, and
// whatever it does not handle goes to json.Marshal.
func FuzzEnvelopeIsJSONMarshal(f *testing.F) {
	seeds := []struct {
		agg, id, typ    string
		payload, header string
		nanos           int64
	}{
		{"deal", "42", "deal.funded", `{"seq": 1, "pad": "xxxx"}`, `{}`, 1_764_000_000_123_456_789},
		{"deal", "42", "deal.funded", `{"a": [1, 2, {"b": null}], "c": "d e"}`, `{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}`, 0},
		{"a<b", "x&y", "t>e", `{"html": "<script>&"}`, `{"h": "a&b"}`, 1},
		{"deal", "1", "deal.x", `{"html": "<b>&amp;"}`, `{}`, 3},
		{"deal", "1", "deal.x", `{}`, `{"h": "a>b"}`, 3},
		{"deal", "1", "deal.x", "{\"s\": \"\u2029\"}", `{}`, 3},
		{"naïve", "ünïcode", "é", `{"s": "\u2028 line sep"}`, `{}`, 5},
		{"tab\there", "quote\"", "back\\slash", `[1,2,3]`, `{}`, 7},
		{"deal", "1", "deal.x", `not json`, `{}`, 9},
		{"deal", "1", "deal.x", `{"ok": true}`, `{"broken": }`, 9},
		{"deal", "1", "deal.x", `"a string"`, ``, 11},
		{"deal", "1", "deal.x", `  {"spaced" :  1 }  `, ` { } `, 13},
		{"", "", "", `null`, `{}`, math.MinInt64}, // 1677
	}
	for _, s := range seeds {
		f.Add(s.agg, s.id, s.typ, []byte(s.payload), []byte(s.header), s.nanos, int64(7))
	}
	f.Fuzz(func(t *testing.T, agg, id, typ string, payload, headers []byte, nanos, evID int64) {
		ev := dispatch.Event{ID: evID, AggregateType: agg, AggregateID: id, EventType: typ,
			Payload: payload, Headers: headers, CreatedAt: time.Unix(0, nanos).In(time.FixedZone("x", 3600))}
		if len(payload) == 0 {
			ev.Payload = nil
		}
		want, wantErr := json.Marshal(ev)
		got, gotErr := envelope(ev)
		if (wantErr == nil) != (gotErr == nil) || !bytes.Equal(got, want) {
			t.Fatalf("envelope(%+v)\n got %s (%v)\nwant %s (%v)", ev, got, gotErr, want, wantErr)
		}
	})
}

// The common event takes the fast path (no reflection).
func TestEnvelopeOfAUsualEventIsWrittenByHand(t *testing.T) {
	ev := dispatch.Event{ID: 1, AggregateType: "deal", AggregateID: "7", EventType: "deal.funded",
		Payload: json.RawMessage(`{"seq": 1}`), Headers: json.RawMessage(`{}`), CreatedAt: time.Now()}
	if _, ok := envelopeFast(ev); !ok {
		t.Fatal("a usual event left the fast path")
	}
}

func BenchmarkEnvelope(b *testing.B) {
	ev := dispatch.Event{ID: 123456, AggregateType: "deal", AggregateID: "417", EventType: "deal.funded",
		Payload:   json.RawMessage(`{"seq": 123456, "deal": "deal-417", "amount_cents": 864192, "pad": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}`),
		Headers:   json.RawMessage(`{}`),
		CreatedAt: time.Now()}
	b.Run("envelope", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = envelope(ev)
		}
	})
	b.Run("json.Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = json.Marshal(ev)
		}
	})
}
