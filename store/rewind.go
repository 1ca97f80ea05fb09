package store

import "context"

// What a read tells about the database's history, so that the poller sees
// ids reused at or below its cursor while it runs (ReadResult.Incarnation
// and SeqLast; the poller acts on them, see poller/rewind.go): the
// fragments incarnation and seq_last of read.sql, columns of its snap row
// (no extra round trip).

// ColdCursor is LoadCursor as on a first start: the saved cursor is
// ignored (it may stand above ids handed out again, after setval() moved
// the sequence back).
func (s ReadPath) ColdCursor(ctx context.Context) (Cursor, error) {
	// No holder saves under the empty lock name (lock names are fixed,
	// non-empty keys), so LoadCursor finds none and computes the cursor.
	return s.LoadCursor(ctx, "")
}
