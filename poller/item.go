package poller

import "github.com/outboxd/outboxd/store"

// outcome of one row in a batch.
type outcome uint8

const (
	pending   outcome = iota // claimed, not reached (aggregate stopped earlier): unclaim
	sent                     // delivered by us
	duplicate                // Redis holds this row's delivered mark: mark without sending
	foreign                  // a newer holder's claim: leave alone
	failed                   // send failed: unclaim, count the attempt
	refused                  // the idempotency key could not be claimed (wrong type, odd value): count the attempt
	poisoned                 // the row cannot be sent as it is (row.Poison): dead-letter, never claimed
)

type item struct {
	row     store.Row
	outcome outcome
	err     error
	// Set when claimed: the row's idempotency key and its delivered mark
	// (keys.Mark), made once and used again by finish (an allocation per
	// event each).
	key, mark string
}

// aggregateOf is the aggregate of the item's row.
func aggregateOf(it item) store.Aggregate {
	return store.Aggregate{Type: it.row.AggregateType, ID: it.row.AggregateID}
}
