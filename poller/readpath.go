package poller

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/outboxd/outboxd/internal/metrics"
	"github.com/outboxd/outboxd/store"
)

// reader is one term's place in the outbox: the mechanisms of the read
// path (doc.go), tied together by fetch. It is used by the lead goroutine
// only (batch runs serially), so it needs no lock. It changes a mechanism
// only through that mechanism's methods.
type reader struct {
	deps     readDeps
	fence    store.Fence
	loaded   bool
	loadCold bool // load with store.ReadPath.ColdCursor, ignoring the saved cursor (rewind.go)
	cur      readCursor
	gaps     gapWatch
	parked   parkedSet
	late     lateCommits
	rescan   rescanPacer
	coldPass coldPass
	epoch    epochWatch
}

// readDeps are what a reader acts on; the runner gives them at a term's
// start.
type readDeps struct {
	store       store.ReadPath
	log         *slog.Logger
	m           *metrics.Metrics
	gapWait     time.Duration // Config.GapWait
	rescanEvery time.Duration // how often the slow rescan below the cursor starts
	maxInherit  int           // bound of the inherited late-commit check
	maxLastSent int           // bound of the sent memory
	stats       *readStats
}

// readStats counts what the read path did, this process; tests read it.
type readStats struct {
	rescanned   atomic.Int64 // ids the rescan steps below the cursor spanned
	gapRuns     atomic.Int64 // runs of watched gaps after the last read (gaps.go)
	watchedMost atomic.Int64 // most gap ids one read looked up
}

// restart says what a read asks of the term's read state.
type restart uint8

const (
	readOn    restart = iota // the read stands
	readAgain                // drop the read state, load the saved cursor again
	readCold                 // drop the read state, start cold (store.ReadPath.ColdCursor)
)

// newReader returns a term's reader for fence f; cold loads it with
// store.ReadPath.ColdCursor.
func newReader(f store.Fence, d readDeps, cold bool) *reader {
	return &reader{deps: d, fence: f, loadCold: cold, parked: parkedSet{}, late: newLateCommits(d.maxLastSent)}
}

// report is where the reader's late commits are warned and counted.
func (r *reader) report() lateReport { return lateReport{log: r.deps.log, m: r.deps.m} }

// fetch reads the next batch's rows from the term's place and moves it on.
// held says rows were read that wait behind an earlier id (a gap). A
// restart other than readOn says the read state must start again: the read
// reused ids at or below the cursor (rewind.go), and no row is returned.
func (r *reader) fetch(ctx context.Context, lim store.FetchLimits) (rows []store.Row, held bool, again restart, err error) {
	if !r.loaded {
		if err := r.load(ctx); err != nil {
			return nil, false, readOn, err
		}
	}
	below := r.cur.at // rows taken at or below it come from below the cursor, not from the scan
	res, err := r.deps.store.Read(ctx, lim, r.pos(time.Now()))
	if err != nil {
		return nil, false, readOn, err
	}
	if reason, cold := r.epoch.idsReused(res, r.cur.at, r.deps.log); reason != "" {
		// New rows reuse ids at or below the cursor, where the scan would
		// never look: start again (see rewind.go).
		r.deps.m.ReadRestarts.WithLabelValues(reason).Inc()
		if cold {
			return nil, true, readCold, nil
		}
		return nil, true, readAgain, nil
	}
	r.gaps.holdBack(&res)
	r.cur.noteInflight(lim.Skip, res.Rows)
	r.advance(res, lim.Rows, time.Now())
	r.checkTaken(ctx, res.Rows, below)
	if err := r.maintain(ctx, len(res.Rows) == 0, res.XMin); err != nil {
		// Saving the cursor or a rescan step failed: the read itself stands;
		// a stale fence shows again on the batch's write.
		r.deps.log.Warn("read path upkeep failed", "error", err)
	}
	return res.Rows, anyHeld(res.Hot), readOn, nil
}

// load starts the term's reader from the cursor its predecessor saved
// (store.ReadPath.LoadCursor: fenced, conservative: parked aggregates, watched gaps
// and rows in flight folded in), or a computed one when none is saved.
func (r *reader) load(ctx context.Context) error {
	var saved store.Cursor
	var err error
	if r.loadCold {
		saved, err = r.deps.store.ColdCursor(ctx)
	} else {
		saved, err = r.deps.store.LoadCursor(ctx, r.fence.Lock)
	}
	if err != nil {
		return err
	}
	c, sent, horizon, epoch := saved.At, saved.Sent, saved.Horizon, saved.Epoch
	now := time.Now()
	r.cur = newReadCursor(c, sent, horizon)
	r.coldPass = newColdPass(c, horizon, now)
	r.epoch = newEpochWatch(epoch)
	r.late.loaded(c, sent)
	// LoadCursor's own walk saw every row visible at the start (or the
	// predecessor's term-start pass did): with a horizon, a pass now would
	// find nothing new; the cold pass at the horizon will.
	to := c
	if horizon != 0 {
		to = 0
	}
	r.rescan.begin(to, now)
	r.loaded = true
	r.deps.log.Info("read path starts", "cursor", c, "sent", sent, "cold_horizon", horizon)
	return nil
}

// pos is what Read needs from r: the cursor, the gaps to look up and hold
// by (gapWatch.watch) and the parked aggregates.
func (r *reader) pos(now time.Time) store.ReadPos {
	pos := store.ReadPos{Cursor: r.cur.at, Frontier: r.cur.frontier}
	r.gaps.watch(&pos, now, r.deps.gapWait)
	pos.Parked = r.parked.list()
	if n := int64(len(pos.Watch)); n > r.deps.stats.watchedMost.Load() {
		r.deps.stats.watchedMost.Store(n) // the lead goroutine is its only writer
	}
	return pos
}

// anyHeld says whether a read's hot rows wait behind a gap.
func anyHeld(hot []store.HotRow) bool {
	return slices.ContainsFunc(hot, func(h store.HotRow) bool { return h.State == store.HotHeld })
}

// advance takes in what a read saw: the parked aggregates' first rows,
// gaps found visible, gaps settled or given up, new gaps, the cursor moved
// past what is settled, and the rows it passed parked. limit is the read's
// row limit, which also bounds its scan above the cursor (readCursor.move).
func (r *reader) advance(res store.ReadResult, limit int, now time.Time) {
	slices.SortFunc(res.Rows, func(a, b store.Row) int { return cmp.Compare(a.ID, b.ID) })
	slices.SortFunc(res.Hot, func(a, b store.HotRow) int { return cmp.Compare(a.ID, b.ID) })
	// The read's answer for the parked aggregates goes first: a gap found
	// visible below parks its aggregate at the gap, lower than the answer.
	r.answerParked(res.Parked)
	r.gapsVisible(res, now)
	r.settleGaps(res.XMin, now)
	r.addGaps(res, now)
	r.cur.move(res, limit, r.gaps.set())
	r.parkPassed(res.Hot)
}

// answerParked applies a read's first row of each parked aggregate; one
// with none left is dropped.
func (r *reader) answerParked(first map[store.Aggregate]int64) {
	for a, id := range first {
		if r.parked.answer(a, id) {
			r.late.forgetFound(a)
		}
	}
}

// gapsVisible takes the watched gaps a read found visible out of the
// watch: a late commit when one given up is pending (lateCommits), parked
// when pending below the cursor (found again through its aggregate until
// sent).
func (r *reader) gapsVisible(res store.ReadResult, now time.Time) {
	seen := func(id int64, a store.Aggregate, pending bool) {
		g, ok := r.gaps.visible(id)
		if !ok {
			return
		}
		if g.givenUp && pending {
			after, late := r.late.gapCommitted(g, id, a)
			r.report().gapCommitted(id, a, after, late, now.Sub(g.seen))
		}
		if pending && id <= r.cur.at {
			r.parked.park(a, id)
		}
	}
	for _, w := range res.Visible {
		seen(w.ID, w.Aggregate, w.Pending)
	}
	for _, h := range res.Hot {
		seen(h.ID, h.Aggregate, true)
	}
	for _, row := range res.Rows { // taken rows are not in res.Hot
		seen(row.ID, store.Aggregate{Type: row.AggregateType, ID: row.AggregateID}, true)
	}
}

// settleGaps moves the watched gaps on (gapWatch.settle) and counts and
// logs those given up.
func (r *reader) settleGaps(xmin uint64, now time.Time) {
	for _, g := range r.gaps.settle(xmin, now, r.deps.gapWait, r.late.generation()) {
		r.deps.m.GapsGivenUp.Add(float64(g.size()))
		r.deps.log.Debug("gap given up", "outbox_id", g.lo, "to_id", g.hi, "waited_ms", now.Sub(g.seen).Milliseconds())
	}
}

// addGaps watches a read's new gaps.
func (r *reader) addGaps(res store.ReadResult, now time.Time) {
	r.gaps.found(res.NewGaps, gapState{horizon: res.XMax, seen: now})
	switch n := len(res.NewGaps); {
	case n == 0:
	case n <= watchOldPerRead:
		for _, id := range res.NewGaps {
			r.deps.log.Debug("waiting for an earlier id", "outbox_id", id)
		}
	default: // a bulk transaction's: a line a read, not one per id
		r.deps.log.Debug("waiting for earlier ids", "outbox_id", slices.Min(res.NewGaps), "to_id", slices.Max(res.NewGaps), "gaps", n)
	}
	r.deps.stats.gapRuns.Store(int64(len(r.gaps.set())))
}

// parkPassed parks the aggregates of hot rows the cursor passed that a
// backing-off or busy aggregate kept back.
func (r *reader) parkPassed(hot []store.HotRow) {
	for _, h := range hot {
		if h.ID <= r.cur.at && (h.State == store.HotBlocked || h.State == store.HotBusy) {
			r.parked.park(h.Aggregate, h.ID)
		}
	}
}

// checkTaken runs the late-commit checks on a read's taken rows (the rows
// taken at or below below came from below the cursor) and records them as
// sent: a gap of their aggregate that becomes visible while they are in
// flight goes after them, a late commit.
func (r *reader) checkTaken(ctx context.Context, rows []store.Row, below int64) {
	late, err := r.late.checkTaken(ctx, r.deps.store, r.deps.maxInherit, rows, below)
	for _, l := range late {
		r.report().late(l)
	}
	if err != nil {
		// The rows are delivered all the same; only a WARN may be missing.
		r.deps.log.Warn("late commit check failed", "error", err)
	}
	for _, row := range rows {
		r.late.noteSent(store.Aggregate{Type: row.AggregateType, ID: row.AggregateID}, row.ID)
	}
}

// written takes in what the writer wrote: delivered rows for the
// late-commit memory, rows left pending below the cursor to park (an
// aggregate stopped, a newer holder's claim), so the next reads find them
// again. A failed write's rows go back above the cursor, to be read again.
func (r *reader) written(items []item, failed bool) {
	for _, it := range items {
		a := aggregateOf(it)
		switch it.outcome {
		case sent, duplicate:
			r.late.noteSent(a, it.row.ID)
		case pending, foreign:
			if it.row.ID <= r.cur.at {
				r.parked.park(a, it.row.ID)
			}
		}
	}
	if failed {
		ids := make([]int64, len(items))
		for i, it := range items {
			ids[i] = it.row.ID
		}
		r.cur.rewind(ids)
	}
}

// unread brings rows fetched but not handled back above the cursor.
func (r *reader) unread(rows []store.Row) {
	ids := make([]int64, len(rows))
	for i, row := range rows {
		ids[i] = row.ID
	}
	r.cur.rewind(ids)
}

// saveable is the cursor a successor may start from.
func (r *reader) saveable() int64 { return r.cur.saveable(r.parked, r.gaps.set()) }

// maintain starts a cold or periodic pass below the cursor when one is
// due, saves the cursor (at most every saveEvery), and runs a rescan step
// when the pacer allows one.
func (r *reader) maintain(ctx context.Context, idle bool, xmin uint64) error {
	now := time.Now()
	r.startColdPass(xmin, now, r.deps.rescanEvery)
	if err := r.saveCursor(ctx, now); err != nil {
		return err
	}
	r.rescan.startEvery(now, r.deps.rescanEvery, r.cur.at)
	lo, hi, ok := r.rescan.due(now, idle)
	if !ok {
		return nil
	}
	return r.rescanStep(ctx, lo, hi)
}

// startColdPass starts the cold pass when it is due and no pass runs.
func (r *reader) startColdPass(xmin uint64, now time.Time, every time.Duration) {
	if r.rescan.passing() {
		return
	}
	if to, timer, ok := r.coldPass.due(xmin, now, every, r.cur.at); ok {
		if timer {
			r.rescan.begin(to, now)
		} else {
			r.rescan.pass(to)
		}
	}
	if !r.rescan.passing() {
		r.coldPass.idle()
	}
}

// saveCursor saves the cursor a successor may start from when it, the sent
// mark or the cold pass owed moved. The sent mark counts too: while a
// given-up gap holds the cursor still, rows of its aggregate above it go
// out, and a successor needs the mark to warn when the gap commits.
func (r *reader) saveCursor(ctx context.Context, now time.Time) error {
	c, sent, owed := r.saveable(), r.late.mark(), r.coldPass.owing()
	if !r.cur.saveDue(c, sent, owed, now) {
		return nil
	}
	if err := r.deps.store.SaveCursor(ctx, r.fence, store.Cursor{At: c, Sent: sent, Horizon: owed, Epoch: r.epoch.cursorEpoch()}); err != nil {
		return fmt.Errorf("save cursor: %w", err)
	}
	r.cur.savedAs(c, sent, owed, now)
	return nil
}

// rescanStep looks at (lo, hi] below the cursor and parks what it finds
// pending there. What the term did not know of (a row that re-entered the
// pending set, or a late commit whose gap is no longer watched) is noted
// for the late-commit check below the cursor.
func (r *reader) rescanStep(ctx context.Context, lo, hi int64) error {
	start := time.Now() // the step's own cost, not the cursor save's
	found, err := r.deps.store.PendingBetween(ctx, lo, hi)
	if err != nil {
		return err
	}
	for _, f := range found {
		if cur, ok := r.parked.from(f.Aggregate); (!ok || f.MinID < cur) && !r.gaps.watches(f.MinID) {
			r.late.noteFound(f.Aggregate, f.MinID)
		}
		r.parked.park(f.Aggregate, f.MinID)
	}
	r.deps.stats.rescanned.Add(hi - lo)
	r.rescan.took(hi, start, time.Now())
	return nil
}
