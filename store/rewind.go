package store

import "context"

// What a read tells about the database's history, so that the poller sees
// ids reused at or below its cursor while it runs (ReadResult.Incarnation
// and SeqLast; the poller acts on them, see poller/rewind.go). Both are
// columns of readSQL's snap row: no extra round trip.

// incarnationSQL names the server the read ran on: its start time. A
// failover (the promoted replica is another postmaster), a restored backup
// or data directory started in place, or any restart changes it; a backend
// crash that the postmaster recovers from in place (restart_after_crash)
// does not. PUBLIC may call it, and it touches no buffer. (The WAL
// timeline adds nothing: every rewind it shows comes with another
// postmaster, and pg_walfile_name fails on a standby.) As seconds since
// 1970, so that no session setting (TimeZone, DateStyle) changes the text:
// connections set differently would otherwise read as servers changing.
const incarnationSQL = `extract(epoch FROM pg_postmaster_start_time())::text`

// seqLastSQL is the id sequence's last value, or NULL when the role may
// not read it: pg_sequence_last_value needs SELECT or USAGE on the
// sequence, and a relay role with table privileges only must keep working
// (the CASE keeps the call from running without them, as pg_sequences does).
// NULL too when no id was handed out since the sequence was created or set
// with is_called false: its next id is then unknown here, not 0 (read as
// 0, setval(seq, max(id) + 1, false), a forward move, looked like a rewind:
// a WARN and a cold start; a setval back with is_called false is seen at
// the first id handed out after it, before any reused id is read).
// The value only grows while ids are handed out; lower than a value seen
// before means setval() or a restore moved it back. idSeqSQL names the
// sequence (one buffer more per read: the sequence's page).
const seqLastSQL = `CASE WHEN idseq.seq IS NOT NULL AND has_sequence_privilege(idseq.seq, 'SELECT,USAGE')
      THEN pg_sequence_last_value(idseq.seq) END`

// ColdCursor is LoadCursor as on a first start: the saved cursor is
// ignored (it may stand above ids handed out again, after setval() moved
// the sequence back). lock is unused: no saved cursor is read.
func (s *Store) ColdCursor(ctx context.Context, _ string) (cursor, sent int64, horizon uint64, epoch string, err error) {
	// No holder saves under the empty lock name (lock names are fixed,
	// non-empty keys), so LoadCursor finds none and computes the cursor.
	return s.LoadCursor(ctx, "")
}
