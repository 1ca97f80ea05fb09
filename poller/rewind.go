package poller

import (
	"log/slog"

	"github.com/outboxd/outboxd/store"
)

// Reasons for outboxd_read_restarts_total.
const (
	restartEpoch       = "ids_restarted"    // new storage: TRUNCATE, RESTART
	restartIncarnation = "server_changed"   // failover, restore, restart
	restartSequence    = "sequence_rewound" // setval() back
)

// epochWatch finds ids reused at or below the cursor while the relay runs.
// The database went back in time under it, so new rows get ids the scan
// above the cursor never looks at again (docs/design.md, "The read path").
// Each read says which server it ran on and where the id sequence stands
// (store.ReadResult.Incarnation, SeqLast). The reader checks each read
// here before it takes anything from it:
//
//   - Another server incarnation (a failover to a replica that may have
//     lagged, a restored backup, any restart) drops the term's read state.
//     The term loads again the cursor that server saved (store.ReadPath.LoadCursor).
//     That cursor is consistent with the rows there, since the rows'
//     results were written before it. Reused ids above it are read as new
//     rows. Rows whose result that server lost are read again, and their
//     delivered marks in Redis say duplicate.
//   - A sequence value below the highest an earlier read of the term saw
//     (setval() back, on the same server) drops the read state. The term
//     starts cold (store.ReadPath.ColdCursor), ignoring the saved cursor, which may
//     be above the reused ids. The rescan every new term starts with covers
//     a rewind while no relay ran.
//
// Either way the read's rows are not taken: they were chosen from the stale
// cursor. A WARN names what was seen, and outboxd_read_restarts_total{reason}
// counts it.
//
// Batches in flight across the change write their results to the new
// server. A delivery or a failure names the row read (store.Delivered and
// store.Failure match its created_at). So a new row that took the id is
// neither marked delivered nor dead-lettered unsent. A write that left one
// unwritten has its rows read again (finish, writtenNote).
//
// Not guaranteed (the slow rescan still finds such rows):
//   - a sequence moved back and then past its old value before the next
//     read: the comparison sees no decrease;
//   - setval under a role that may not read the sequence (SeqLast -1); a
//     new incarnation is still seen;
//   - a server change between a term's LoadCursor and its first read: the
//     first read's server is the reference;
//   - a crash restart of backends only (restart_after_crash) that lost
//     unflushed WAL: the incarnation stays.
type epochWatch struct {
	epoch       string // the epoch the cursor belongs to, loaded and saved with it
	incarnation string // the server the reads run on ("" before the first)
	seqFloor    int64  // the lowest value the id sequence may show
}

// newEpochWatch returns the watch of a term whose cursor belongs to epoch.
func newEpochWatch(epoch string) epochWatch { return epochWatch{epoch: epoch} }

// cursorEpoch is the epoch the cursor belongs to, saved with it.
func (w *epochWatch) cursorEpoch() string { return w.epoch }

// idsReused checks a read against what the term's reads saw before; cursor
// is the term's cursor, for the WARN. It returns the reason to drop the
// read state ("" when the read stands) and whether the new state must start
// cold (ignoring the saved cursor).
func (w *epochWatch) idsReused(res store.ReadResult, cursor int64, log *slog.Logger) (reason string, cold bool) {
	switch {
	case res.Epoch != w.epoch:
		// TRUNCATE or an id RESTART: the saved cursor belongs to the old
		// epoch, so LoadCursor starts cold by itself.
		log.Warn("outbox ids started again (TRUNCATE, id RESTART): reading from the start", "cursor", cursor)
		return restartEpoch, false
	case w.incarnation != "" && res.Incarnation != w.incarnation:
		log.Warn("database server changed (failover, restore or restart): reloading the saved cursor",
			"cursor", cursor, "was", w.incarnation, "now", res.Incarnation)
		return restartIncarnation, false
	case res.SeqLast >= 0 && res.SeqLast < w.seqFloor:
		log.Warn("outbox id sequence went back (setval): reading from the start",
			"cursor", cursor, "sequence_last_value", res.SeqLast, "seen", w.seqFloor)
		return restartSequence, true
	}
	w.incarnation = res.Incarnation
	w.seqFloor = max(w.seqFloor, res.SeqLast)
	return "", false
}
