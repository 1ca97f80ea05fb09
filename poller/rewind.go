package poller

import (
	"github.com/outboxd/outboxd/store"
)

// Ids reused at or below the cursor while the relay runs: the database went
// back in time under it, so rows get ids the scan above the cursor never
// looks at again (docs/design.md, "The read path"). Each read says which server it ran on and where the id
// sequence stands (store.ReadResult.Incarnation, SeqLast), and fetch acts
// on it before it takes anything from that read:
//
//   - Another server incarnation (a failover, to a replica that may have
//     lagged; a restored backup or data directory started in place; any
//     restart): the term's read state is dropped and the cursor the database
//     itself saved (store.LoadCursor) is loaded again. That saved cursor is
//     consistent with the rows there (WAL order: the rows' results were
//     written before it), so reused ids above it are read as new rows, and
//     rows whose result that server lost are read again (their delivered
//     marks in Redis say duplicate).
//   - The sequence's last value below the highest an earlier read of the
//     term saw (setval() back, on the same server): the read state is
//     dropped and the term starts cold (store.ColdCursor, as on a first
//     start), ignoring the saved cursor, which may be above the reused ids.
//     A rewind while no relay ran is left to the rescan every new term
//     starts with (from 0 up to the loaded cursor).
//
// Either way the read's rows are not taken (they were chosen from the stale
// cursor), a WARN names what was seen and
// outboxd_read_restarts_total{reason} counts it.
//
// Not guaranteed (the slow rescan, every rescanEvery, still finds such
// rows): a sequence moved back and then past its old value by producers
// before the next read (one poll interval; the comparison sees no decrease);
// a role that may not read the sequence (no SELECT or USAGE: SeqLast -1, so
// setval goes unseen; a new incarnation is still seen); a server change
// between a term's LoadCursor and its first read (the first read's server
// is the reference); a crash restart of backends only (restart_after_crash:
// the postmaster, and so the incarnation, stays) that lost unflushed WAL.
// Batches in flight across the change write their results to the new
// server: a delivery or a failure only to the row read (store.Delivered
// and store.Failure match its created_at), so a new row that took the id
// is neither marked delivered nor dead-lettered unsent, and a write that
// left one unwritten has its rows read again (finish, writtenNote), so
// that new row is sent.

// Reasons for outboxd_read_restarts_total.
const (
	restartEpoch       = "ids_restarted"    // new storage: TRUNCATE, RESTART
	restartIncarnation = "server_changed"   // failover, restore, restart
	restartSequence    = "sequence_rewound" // setval() back
)

// epochWatch is what the reads of a term saw of the ids: the epoch the
// cursor belongs to (store.ReadResult.Epoch, loaded and saved with it), the
// server the reads run on ("" before the first), and the lowest value the
// id sequence may show.
type epochWatch struct {
	epoch       string
	incarnation string
	seqFloor    int64
}

// idsReused checks a read against what the reader saw before. It returns the
// reason to drop the read state ("" when the read stands) and whether the
// new state must start cold (ignoring the saved cursor).
func (p *Poller) idsReused(r *reader, res store.ReadResult) (reason string, cold bool) {
	w := &r.epoch
	switch {
	case res.Epoch != w.epoch:
		// TRUNCATE or an id RESTART: the saved cursor belongs to the old
		// epoch, so LoadCursor starts cold by itself.
		p.log.Warn("outbox ids started again (TRUNCATE, id RESTART): reading from the start", "cursor", r.cur.at)
		return restartEpoch, false
	case w.incarnation != "" && res.Incarnation != w.incarnation:
		p.log.Warn("database server changed (failover, restore or restart): reloading the saved cursor",
			"cursor", r.cur.at, "was", w.incarnation, "now", res.Incarnation)
		return restartIncarnation, false
	case res.SeqLast >= 0 && res.SeqLast < w.seqFloor:
		p.log.Warn("outbox id sequence went back (setval): reading from the start",
			"cursor", r.cur.at, "sequence_last_value", res.SeqLast, "seen", w.seqFloor)
		return restartSequence, true
	}
	w.incarnation = res.Incarnation
	w.seqFloor = max(w.seqFloor, res.SeqLast)
	return "", false
}
