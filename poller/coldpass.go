package poller

import "time"

// coldPass finds the rows that producers in flight when a term computed its
// cursor (store.ReadPath.LoadCursor: no cursor saved) left below it. A computed
// cursor is right for every row visible in that computation's snapshot;
// once every transaction in flight then has ended (a read's snapshot xmin
// reaches horizon), one pass over (0, to] finds what they left. Until then
// a pass runs every rescanEvery, so a long transaction does not hide a row
// for ever, and never back to back: each walks the whole settled history.
// owed is the horizon until that last pass has completed: saved with the
// cursor (store.ReadPath.SaveCursor), it hands the pass to a successor that takes
// over first.
type coldPass struct {
	to      int64     // the computed cursor
	horizon uint64    // 0: no pass waits for the horizon
	owed    uint64    // 0: no pass is owed
	at      time.Time // the last pass the timer started
}

// newColdPass returns the cold pass of a term that loaded cursor to with
// horizon (0: no pass is owed) at now.
func newColdPass(to int64, horizon uint64, now time.Time) coldPass {
	return coldPass{to: to, horizon: horizon, owed: horizon, at: now}
}

// owing is the horizon saved with the cursor: 0 once no pass is owed.
func (c *coldPass) owing() uint64 { return c.owed }

// due returns the pass to start now, over (0, to], if any. timer says it
// is the periodic one, which is the rescan's periodic pass too. cursor is
// the term's cursor, which a periodic pass covers.
func (c *coldPass) due(xmin uint64, now time.Time, every time.Duration, cursor int64) (to int64, timer, ok bool) {
	switch {
	case c.horizon == 0:
		return 0, false, false
	case xmin >= c.horizon:
		c.horizon = 0 // the last cold pass
		return c.to, false, true
	case now.Sub(c.at) >= every:
		c.at = now
		return max(c.to, cursor), true, true
	}
	return 0, false, false
}

// idle notes that no pass runs: once the last pass has started, it has
// completed, and nothing is owed.
func (c *coldPass) idle() {
	if c.horizon == 0 {
		c.owed = 0
	}
}
