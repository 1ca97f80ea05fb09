package dispatch_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/outboxd/outboxd/dispatch"
)

func TestTemplates(t *testing.T) {
	ev := dispatch.Event{AggregateType: "deal", EventType: "deal.funded"}
	for _, tc := range []struct{ tmpl, want string }{
		{"outbox.event.{aggregate_type}", "outbox.event.deal"},
		{"{aggregate_type}.{event_type}", "deal.deal.funded"},
		{"fixed", "fixed"},
		{"{event_type}", "deal.funded"},
	} {
		tm, err := dispatch.ParseTemplate(tc.tmpl)
		if err != nil || tm.Expand(ev) != tc.want {
			t.Errorf("%q: %q %v, want %q", tc.tmpl, tm.Expand(ev), err, tc.want)
		}
	}
	for _, bad := range []string{"", "outbox.{aggregate}", "outbox.{aggregate_type", "{}"} {
		if _, err := dispatch.ParseTemplate(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// The contract's headers first, the row's own after them (never replacing
// one), CloudEvents last when enabled; unsafe entries dropped and named.
func TestHeadersFollowTheContract(t *testing.T) {
	ev := dispatch.Event{ID: 42, AggregateType: "deal", AggregateID: "7", EventType: "deal.funded",
		CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		Headers:   json.RawMessage(`{"traceparent":"00-ab-cd-01","ID":"spoof","n":3,"evil":"a\r\nb","":"x","ce-id":"spoof"}`)}
	hs, dropped := dispatch.Headers(ev, 9, dispatch.CloudEvents{Enabled: true}, "ce-")
	got := fmt.Sprint(hs)
	want := "[{id 42} {aggregate_type deal} {aggregate_id 7} {event_type deal.funded} {created_at 2026-01-02T03:04:05Z} " +
		"{fencing_token 9} {n 3} {traceparent 00-ab-cd-01} {ce-specversion 1.0} {ce-id 42} {ce-source outboxd} " +
		"{ce-type deal.funded} {ce-time 2026-01-02T03:04:05Z} {ce-aggregatetype deal} {ce-aggregateid 7}]"
	if got != want {
		t.Fatalf("headers\n %s\nwant\n %s", got, want)
	}
	if fmt.Sprint(dropped) != "[ ID ce-id evil]" {
		t.Fatalf("dropped %q", dropped)
	}
	hs, _ = dispatch.Headers(ev, 9, dispatch.CloudEvents{Enabled: true, Source: "payments"}, "ce_")
	if hs[len(hs)-5] != (dispatch.Header{Key: "ce_source", Value: "payments"}) {
		t.Fatalf("kafka-style attributes: %v", hs)
	}
	hs, _ = dispatch.Headers(dispatch.Event{ID: 1, Headers: json.RawMessage(`[1,2]`)}, 1, dispatch.CloudEvents{}, "ce-")
	if len(hs) != 6 {
		t.Fatalf("headers that are not an object: %v", hs)
	}
}
