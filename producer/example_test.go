package producer_test

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/producer"
)

// A service writes its business row and the event that announces it in one
// transaction: both commit, or neither does. outboxd relays the event once
// the transaction has committed.
func ExampleEnqueue() {
	ctx := context.Background()
	dsn, drop, err := testenv.FreshDSN() // a migrated database of its own
	if err != nil {
		panic(err)
	}
	defer func() { _ = drop() }()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// The service's own writes go here, on tx.
		return producer.Enqueue(ctx, tx, producer.Event{
			AggregateType: "deal",
			AggregateID:   "42",
			EventType:     "deal.funded",
			Payload:       json.RawMessage(`{"amount":1000}`),
			Headers:       map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		})
	})
	if err != nil {
		panic(err)
	}

	var aggregate, kind, payload string
	if err := pool.QueryRow(ctx,
		`SELECT aggregate_type || '/' || aggregate_id, event_type, payload::text FROM outbox`,
	).Scan(&aggregate, &kind, &payload); err != nil {
		panic(err)
	}
	fmt.Println(aggregate, kind, payload)
	// Output: deal/42 deal.funded {"amount": 1000}
}
