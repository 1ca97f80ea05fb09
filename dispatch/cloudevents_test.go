package dispatch_test

import (
	"bytes"
	"encoding/json"
	"net/url"
	"testing"
	"time"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/internal/cetest"
)

// awkward has attribute values a header cannot carry as they are: spaces,
// a double quote, a percent sign, non-ASCII.
func awkward() dispatch.Event {
	return dispatch.Event{ID: 77, AggregateType: "deal", AggregateID: "42 \"x\" 100%", EventType: "deal funded €",
		Payload: json.RawMessage(`{"amount": 1, "note": "<b>&</b>"}`), Headers: json.RawMessage(`{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}`),
		CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 678900000, time.UTC)}
}

// want is the CloudEvent of ev with source and data (the payload unless
// given).
func want(ev dispatch.Event, source string) cetest.Want {
	return cetest.Want{ID: ev.ID, Source: source, Type: ev.EventType, Time: ev.CreatedAt,
		AggregateType: ev.AggregateType, AggregateID: ev.AggregateID, Data: string(ev.Payload)}
}

// The bindings' percent-encoding, checked against the NATS binding's own
// example (§3.1.3.2) and decoded by net/url.
func TestPercentEncode(t *testing.T) {
	if got := dispatch.PercentEncode("Euro € 😀"); got != "Euro%20%E2%82%AC%20%F0%9F%98%80" {
		t.Fatalf("spec example encoded as %q", got)
	}
	for _, s := range []string{"", "deal.funded", "2026-01-02T03:04:05Z", `a "b" 100% c`, "tab\there", "del\x7f", "ünï 😀"} {
		enc := dispatch.PercentEncode(s)
		for i := range len(enc) {
			if c := enc[i]; c <= ' ' || c > '~' || c == '"' {
				t.Errorf("%q encoded as %q: byte %q left", s, enc, c)
			}
		}
		if dec, err := url.PathUnescape(enc); err != nil || dec != s {
			t.Errorf("%q encoded as %q decodes to %q (%v)", s, enc, dec, err)
		}
	}
}

// Every broker binding in both modes, as its specification reads it,
// decodes with the CloudEvents SDK to the row's event.
func TestEncodeDecodesWithTheSDK(t *testing.T) {
	ev := awkward()
	for _, tc := range []struct {
		name    string
		binding dispatch.Binding
		// read describes the message as the binding's specification
		// does (not as outboxd's Binding does).
		read func(m dispatch.Message, h map[string]string) cetest.Message
	}{
		{"kafka", dispatch.KafkaBinding, func(m dispatch.Message, h map[string]string) cetest.Message {
			return cetest.Message{Prefix: "ce_", ContentType: h["content-type"], Headers: h, Body: m.Body}
		}},
		{"amqp", dispatch.AMQPBinding, func(m dispatch.Message, h map[string]string) cetest.Message {
			return cetest.Message{Prefix: "cloudEvents_", ContentType: m.ContentType, Headers: h, Body: m.Body}
		}},
		{"nats", dispatch.NATSBinding, func(m dispatch.Message, h map[string]string) cetest.Message {
			return cetest.Message{Prefix: "ce-", PercentDecode: true, ContentType: h["Content-Type"], Headers: h, Body: m.Body}
		}},
		{"redis_stream", dispatch.RedisStreamBinding, func(m dispatch.Message, h map[string]string) cetest.Message {
			return cetest.Message{Prefix: "ce-", ContentType: h["content-type"], Headers: h, Body: m.Body}
		}},
	} {
		for _, mode := range []string{dispatch.CloudEventsBinary, dispatch.CloudEventsStructured} {
			t.Run(tc.name+"/"+mode, func(t *testing.T) {
				m := dispatch.Encode(ev, 3, dispatch.CloudEvents{Enabled: true, Source: "urn:billing eu", Mode: mode}, tc.binding)
				h := map[string]string{}
				for _, x := range m.Headers {
					h[x.Key] = x.Value
				}
				if h["id"] != "77" || h["aggregate_id"] != ev.AggregateID || h["fencing_token"] != "3" || h["traceparent"] == "" {
					t.Errorf("the contract's headers are kept in every mode: %v", h)
				}
				got, err := cetest.Decode(tc.read(m, h))
				if err != nil {
					t.Fatalf("the SDK cannot decode %v / %s: %v", h, m.Body, err)
				}
				if err := cetest.Check(got, want(ev, "urn:billing eu")); err != nil {
					t.Errorf("decoded %s\n%v", got, err)
				}
				if mode == dispatch.CloudEventsStructured && m.ContentType != "application/cloudevents+json" {
					t.Errorf("structured content type %q", m.ContentType)
				}
			})
		}
	}
}

// Off, nothing of CloudEvents is added and the body is the payload.
func TestEncodeWithoutCloudEvents(t *testing.T) {
	ev := awkward()
	m := dispatch.Encode(ev, 3, dispatch.CloudEvents{Mode: dispatch.CloudEventsStructured}, dispatch.KafkaBinding)
	if !bytes.Equal(m.Body, ev.Payload) || m.ContentType != "application/json" || len(m.Headers) != 7 {
		t.Fatalf("CloudEvents off: %v %s %s", m.Headers, m.Body, m.ContentType)
	}
}
