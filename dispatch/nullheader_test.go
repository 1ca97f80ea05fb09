package dispatch_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/outboxd/outboxd/dispatch"
)

// A row header whose value is JSON null carries no value: it is left out of
// the message, neither "" nor "null", and is not reported as dropped.
func TestNullHeaderValuesAreOmitted(t *testing.T) {
	ev := dispatch.Event{ID: 1, AggregateType: "a", AggregateID: "1", EventType: "e", CreatedAt: time.Unix(0, 0),
		Headers: json.RawMessage(`{"gone":null,"kept":"v","zero":0,"text":"null","empty":""}`)}
	hs, dropped := dispatch.Headers(ev, 1, dispatch.CloudEvents{}, "ce-")
	got := map[string]string{}
	for _, h := range hs[6:] {
		got[h.Key] = h.Value
	}
	want := map[string]string{"kept": "v", "zero": "0", "text": "null", "empty": ""}
	if len(got) != len(want) || len(dropped) != 0 {
		t.Fatalf("row headers %v (dropped %v), want %v", got, dropped, want)
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Fatalf("header %q = %q (present %v), want %q", k, g, ok, v)
		}
	}
}
