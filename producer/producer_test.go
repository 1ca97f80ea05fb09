package producer_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/producer"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// setup gives a test its own migrated database.
func setup(t *testing.T) *pgxpool.Pool {
	t.Helper()
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), testenv.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func event(agg string) producer.Event {
	return producer.Event{AggregateType: "deal", AggregateID: agg, EventType: "deal.funded", Payload: json.RawMessage(`{}`)}
}

// written returns the aggregate ids of the outbox's rows in id order.
func written(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT aggregate_id FROM outbox ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func TestEnqueueWritesWithTheCallersTransaction(t *testing.T) {
	ctx := context.Background()
	t.Run("commits in the order given", func(t *testing.T) {
		pool := setup(t)
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			return producer.Enqueue(ctx, tx, event("b"), event("a"), event("c"))
		}); err != nil {
			t.Fatal(err)
		}
		if got := written(t, pool); !slices.Equal(got, []string{"b", "a", "c"}) {
			t.Fatalf("rows %v, want b a c (the order given)", got)
		}
	})
	t.Run("rolls back with it", func(t *testing.T) {
		pool := setup(t)
		rollback := errors.New("the business transaction fails")
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := producer.Enqueue(ctx, tx, event("a")); err != nil {
				return err
			}
			return rollback
		})
		if !errors.Is(err, rollback) {
			t.Fatal(err)
		}
		if got := written(t, pool); len(got) != 0 {
			t.Fatalf("rows %v after a rollback, want none", got)
		}
	})
	t.Run("refuses a bad event, naming its field, and writes nothing", func(t *testing.T) {
		pool := setup(t)
		for field, ev := range map[string]producer.Event{
			"aggregate_type": {AggregateID: "1", EventType: "x", Payload: json.RawMessage(`{}`)},
			"aggregate_id":   {AggregateType: "a", EventType: "x", Payload: json.RawMessage(`{}`)},
			"event_type":     {AggregateType: "a", AggregateID: "1", Payload: json.RawMessage(`{}`)},
			"payload":        {AggregateType: "a", AggregateID: "1", EventType: "x", Payload: json.RawMessage(`{nope`)},
		} {
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return producer.Enqueue(ctx, tx, event("ok"), ev) })
			if err == nil || !strings.Contains(err.Error(), field) {
				t.Errorf("an event without a valid %s: error %v, want one naming it", field, err)
			}
		}
		if got := written(t, pool); len(got) != 0 {
			t.Fatalf("rows %v, want none: every batch held a bad event", got)
		}
	})
}
