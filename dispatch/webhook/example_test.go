package webhook_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/dispatch/webhook"
)

// A webhook sink sends each event as one POST; the receiver dedupes on
// the Idempotency-Key. Send answers one Result per event, aligned by index.
func ExampleNew() {
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fmt.Println("Idempotency-Key:", r.Header.Get("Idempotency-Key"), "X-Fencing-Token:", r.Header.Get("X-Fencing-Token"))
		fmt.Println(string(body))
	}))
	defer receiver.Close()

	sink, err := webhook.New(webhook.Config{URL: receiver.URL})
	if err != nil {
		panic(err)
	}
	until := time.Now().Add(time.Minute) // the lease's trust deadline
	results := sink.Send(context.Background(), dispatch.Batch{
		Events: []dispatch.Event{{ID: 42, AggregateType: "deal", AggregateID: "7", EventType: "deal.funded",
			Payload: json.RawMessage(`{"amount":100}`), Headers: json.RawMessage(`{}`),
			CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}},
		Token: 3,
		Until: func() time.Time { return until },
	})
	fmt.Println(results[0].Outcome)
	// Output:
	// Idempotency-Key: 42 X-Fencing-Token: 3
	// {"id":42,"aggregate_type":"deal","aggregate_id":"7","event_type":"deal.funded","payload":{"amount":100},"headers":{},"created_at":"2026-01-02T03:04:05Z"}
	// delivered
}
