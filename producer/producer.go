// Package producer is what a service that writes events imports: Enqueue
// writes them into the outbox inside the service's own transaction, so
// they commit or roll back with its business rows; outboxd relays them
// once committed, in id order per aggregate.
//
// It imports nothing of outboxd: a producer needs neither the daemon's
// parts nor its dependencies beyond pgx. store.Enqueue and store.Event
// are the same function and type.
package producer

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Event is what a producer writes.
type Event struct {
	AggregateType string            // with AggregateID, the ordering key
	AggregateID   string            // events of one aggregate are relayed in the order written
	EventType     string            // e.g. deal.funded
	Payload       json.RawMessage   // any JSON value
	Headers       map[string]string // optional; e.g. traceparent
	AvailableAt   time.Time         // optional; zero means now
}

// enqueueFile is enqueue.sql: a header comment, then the statement, its
// table a %s verb, its parameters named (pgx.StrictNamedArgs).
//
//go:embed enqueue.sql
var enqueueFile string

// enqueueSQL is enqueueFile's statement, without its header.
var enqueueSQL = enqueueFile[strings.Index(enqueueFile, "\nINSERT")+1:]

// Enqueue writes events inside the caller's transaction, in one round trip,
// so they commit or roll back with the business rows. Their ids follow the
// order given. An event without its aggregate type, aggregate id or event
// type, or whose payload is not valid JSON, is refused, and nothing is
// written.
func Enqueue(ctx context.Context, tx pgx.Tx, events ...Event) error {
	return EnqueueIn(ctx, tx, "", events...)
}

// EnqueueIn is Enqueue into the outbox of schema (the relay's
// postgres.schema); "" is the outbox the transaction's search_path finds.
func EnqueueIn(ctx context.Context, tx pgx.Tx, schema string, events ...Event) error {
	if len(events) == 0 {
		return nil
	}
	n := len(events)
	types, ids, kinds := make([]string, n), make([]string, n), make([]string, n)
	payloads, headers := make([]string, n), make([]string, n)
	avail := make([]*time.Time, n)
	for i, ev := range events {
		switch {
		case ev.AggregateType == "":
			return fmt.Errorf("producer: event %d: aggregate_type is empty", i)
		case ev.AggregateID == "":
			return fmt.Errorf("producer: event %d: aggregate_id is empty", i)
		case ev.EventType == "":
			return fmt.Errorf("producer: event %d: event_type is empty", i)
		case !json.Valid(ev.Payload):
			return fmt.Errorf("producer: event %d: payload is not valid JSON", i)
		}
		h := []byte("{}")
		if len(ev.Headers) > 0 {
			h, _ = json.Marshal(ev.Headers)
		}
		types[i], ids[i], kinds[i] = ev.AggregateType, ev.AggregateID, ev.EventType
		payloads[i], headers[i] = string(ev.Payload), string(h)
		if !ev.AvailableAt.IsZero() {
			avail[i] = &ev.AvailableAt
		}
	}
	table := pgx.Identifier{"outbox"}
	if schema != "" {
		table = pgx.Identifier{schema, "outbox"}
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf(enqueueSQL, table.Sanitize()), pgx.StrictNamedArgs{
		"types": types, "ids": ids, "event_types": kinds, "payloads": payloads, "headers": headers, "available_at": avail,
	}); err != nil {
		return fmt.Errorf("producer: enqueue: %w", err)
	}
	return nil
}
