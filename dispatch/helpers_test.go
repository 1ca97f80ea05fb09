package dispatch_test

import (
	"encoding/json"
	"time"

	"github.com/outboxd/outboxd/dispatch"
)

// event is one event of aggregate deal/42 with a trace header.
func event() dispatch.Event {
	return dispatch.Event{ID: 123, AggregateType: "deal", AggregateID: "42", EventType: "deal.funded",
		Payload: json.RawMessage(`{"amount":1}`), Headers: json.RawMessage(`{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}`),
		CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}
