package store_test

import "github.com/outboxd/outboxd/store"

// The store's result structs as the values the tests compare.

// counts is a Completed as its delivered and failed counts.
func counts(c store.Completed, err error) (delivered, failed int64, _ error) {
	return c.Delivered, c.Failed, err
}

// cursorOf is a Cursor as its fields.
func cursorOf(c store.Cursor, err error) (at, sent int64, horizon uint64, epoch string, _ error) {
	return c.At, c.Sent, c.Horizon, c.Epoch, err
}

// lateOf is InheritedLate's answer and whether it held every late row and
// hole (not nil).
func lateOf(in *store.Inherited, err error) (*store.Inherited, bool, error) {
	return in, in != nil, err
}

// purgedOf is a Purged as its count and next cursor.
func purgedOf(p store.Purged, err error) (int64, store.PurgeCursor, error) {
	return p.Rows, p.Next, err
}
