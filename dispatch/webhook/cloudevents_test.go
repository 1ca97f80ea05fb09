package webhook_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/dispatch/webhook"
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

// The webhook's request, read by the SDK's own HTTP binding: binary mode
// (ce- headers, the contract's envelope as data) and structured mode (the
// event as application/cloudevents+json, data = the payload).
func TestWebhookCloudEventsDecodeWithTheSDK(t *testing.T) {
	ev := event()
	envelope := `{"id":123,"aggregate_type":"deal","aggregate_id":"42","event_type":"deal.funded","payload":{"amount":1},` +
		`"headers":{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},"created_at":"2026-01-02T03:04:05Z"}`
	for _, tc := range []struct {
		mode, data, contentType string
	}{
		{dispatch.CloudEventsBinary, envelope, "application/json"},
		{dispatch.CloudEventsStructured, `{"amount":1}`, "application/cloudevents+json"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			var got *http.Request
			var body []byte
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				got, body = r, must(io.ReadAll(r.Body))
			}))
			defer srv.Close()
			w, err := webhook.New(webhook.Config{URL: srv.URL,
				CloudEvents: dispatch.CloudEvents{Enabled: true, Source: "payments", Mode: tc.mode}})
			if err != nil {
				t.Fatal(err)
			}
			if err := w.SendEvent(context.Background(), ev, 1); err != nil {
				t.Fatal(err)
			}
			if ct := got.Header.Get("Content-Type"); ct != tc.contentType {
				t.Errorf("Content-Type %q, want %q", ct, tc.contentType)
			}
			if got.Header.Get("Idempotency-Key") != "123" || got.Header.Get("webhook-id") != "123" {
				t.Errorf("the contract's headers are kept in every mode: %v", got.Header)
			}
			decoded, err := binding.ToEvent(context.Background(), cehttp.NewMessage(got.Header, io.NopCloser(bytes.NewReader(body))))
			if err != nil {
				t.Fatalf("the SDK cannot decode %v / %s: %v", got.Header, body, err)
			}
			w2 := want(ev, "payments")
			w2.Data = tc.data
			if err := cetest.Check(decoded, w2); err != nil {
				t.Errorf("decoded %s\n%v", decoded, err)
			}
			if tc.mode == dispatch.CloudEventsStructured {
				for k := range got.Header {
					if strings.HasPrefix(strings.ToLower(k), "ce-") {
						t.Errorf("structured mode sends header %s too", k)
					}
				}
			}
		})
	}
}

// HTTP header values are percent-encoded (HTTP binding §3.1.3.2). The Go
// SDK's HTTP reader does not decode them (it predates the rule), so the
// check decodes with net/url.
func TestWebhookCloudEventsHeadersArePercentEncoded(t *testing.T) {
	var got http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got = r.Header.Clone() }))
	defer srv.Close()
	w, _ := webhook.New(webhook.Config{URL: srv.URL, CloudEvents: dispatch.CloudEvents{Enabled: true, Source: "urn:billing eu"}})
	ev := awkward()
	if err := w.SendEvent(context.Background(), ev, 1); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{"ce-type": ev.EventType, "ce-source": "urn:billing eu", "ce-aggregateid": ev.AggregateID,
		"ce-time": "2026-01-02T03:04:05.6789Z", "ce-id": "77", "ce-specversion": "1.0", "ce-aggregatetype": "deal"} {
		raw := got.Get(k)
		if dec, err := url.PathUnescape(raw); err != nil || dec != v || strings.ContainsAny(raw, " \"") {
			t.Errorf("%s: %q decodes to %q (%v), want %q", k, raw, dec, err, v)
		}
	}
}
