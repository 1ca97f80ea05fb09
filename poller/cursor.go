package poller

import (
	"math"
	"slices"
	"time"

	"github.com/outboxd/outboxd/store"
)

// saveEvery is how often the cursor is saved while it, the sent mark or
// the owed cold pass moves.
const saveEvery = time.Second

// readCursor is where a term's reads stand, so that a fetch never walks what
// was settled before. Every id at or below at is delivered, dead, backing
// off (found through the backoff index when due), in a parked aggregate, or
// a watched gap: the scan for new rows starts above it, and rows delivered
// before, with the index entries a snapshot held elsewhere keeps from
// vacuum, are never walked again. Every id at or below frontier (>= at) is
// known visible or a watched gap.
//
// The cursor a successor may start from (saveable) is lower: below every
// parked row, every watched gap and every row fetched and not yet written
// (a crash before their write leaves them pending). It is saved fenced,
// with the sent mark and the cold pass owed, at most every saveEvery.
type readCursor struct {
	at, frontier int64
	inflightLow  int64 // lowest id fetched and not yet written, as of the last read
	// What was saved last, and when.
	saved, savedSent int64
	savedOwed        uint64
	savedAt          time.Time
}

// newReadCursor returns the cursor a term loaded: at c, with the sent mark
// and the cold pass owed saved beside it. A computed cursor (owed not 0) is
// saved at the first read, moved or not, so that the backlog count and the
// sweep stop taking a floor of their own (store.Reconcile.SweepFloor).
func newReadCursor(c, sent int64, owed uint64) readCursor {
	r := readCursor{at: c, frontier: c, saved: c, savedSent: sent, savedOwed: owed}
	if owed != 0 {
		r.saved = math.MinInt64
	}
	return r
}

// noteInflight records the rows not yet written after a read: the
// pipeline's (skip) and the read's own.
func (c *readCursor) noteInflight(skip []int64, rows []store.Row) {
	c.inflightLow = math.MaxInt64
	for _, id := range skip {
		c.inflightLow = min(c.inflightLow, id)
	}
	for _, row := range rows {
		c.inflightLow = min(c.inflightLow, row.ID)
	}
}

// move takes the cursor up to what the read classified (res, sorted by id),
// below every gap still holding, below the first hot row held or cut, and
// no further than the last row a read stopped by its row limit scanned: a
// scan that stopped there saw nothing beyond, whatever an earlier, longer
// read classified.
func (c *readCursor) move(res store.ReadResult, limit int, gaps gapSet) {
	c.frontier = max(c.frontier, res.Classified)
	to := min(c.frontier, gaps.holdBelow(c.at), firstHeld(res.Hot), c.scannedTo(res, limit))
	c.at = max(c.at, to)
}

// firstHeld is the id below the first hot row held or cut.
func firstHeld(hot []store.HotRow) int64 {
	for _, h := range hot {
		if h.State == store.HotHeld || h.State == store.HotCut {
			return h.ID - 1
		}
	}
	return math.MaxInt64
}

// scannedTo is the last row the read scanned above the cursor when it
// scanned as many as its limit, else no bound.
func (c *readCursor) scannedTo(res store.ReadResult, limit int) int64 {
	scanned, last := 0, int64(0)
	for _, h := range res.Hot {
		scanned, last = scanned+1, max(last, h.ID)
	}
	for _, row := range res.Rows {
		if row.ID > c.at { // taken from the scan, not from below the cursor
			scanned, last = scanned+1, max(last, row.ID)
		}
	}
	if limit > 0 && scanned >= limit {
		return last
	}
	return math.MaxInt64
}

// rewind brings rows whose results were not written back above the
// cursor, so the next reads find them again.
func (c *readCursor) rewind(ids []int64) {
	if len(ids) > 0 {
		c.at = min(c.at, slices.Min(ids)-1)
	}
}

// saveable is the cursor a successor may start from.
func (c *readCursor) saveable(parked parkedSet, gaps gapSet) int64 {
	s := min(c.at, c.inflightLow-1)
	if id, ok := parked.lowest(); ok {
		s = min(s, id-1)
	}
	if len(gaps) > 0 {
		s = min(s, gaps[0].lo-1)
	}
	return s
}

// saveDue says whether a save of (at, sent, owed) is due now.
func (c *readCursor) saveDue(at, sent int64, owed uint64, now time.Time) bool {
	return (at != c.saved || sent != c.savedSent || owed != c.savedOwed) && now.Sub(c.savedAt) >= saveEvery
}

// savedAs records a save.
func (c *readCursor) savedAs(at, sent int64, owed uint64, now time.Time) {
	c.saved, c.savedSent, c.savedOwed, c.savedAt = at, sent, owed, now
}
