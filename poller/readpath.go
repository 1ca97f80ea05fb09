package poller

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/outboxd/outboxd/store"
)

// The read path: where a term stands in the outbox, so that a fetch never
// walks what was settled before, and per-aggregate id order holds while
// producers race. Each mechanism is its own type:
//
//   - readCursor (cursor.go): the scan starts above it; saved, fenced, for a
//     successor to start from;
//   - gapWatch (gaps.go): rows above an id not yet visible wait while it
//     may still commit, at most gap_wait;
//   - parkedSet (parked.go): aggregates with pending rows at or below the
//     cursor, looked up by each read;
//   - lateCommits (late.go): late commits are delivered, warned and
//     counted, within a term, across a change of holder and below the
//     cursor;
//   - rescanPacer (rescan.go) and coldPass (coldpass.go): the slow rescan
//     below the cursor, and the pass that finds what producers in flight
//     at a computed cursor left below it;
//   - epochWatch (rewind.go): ids reused at or below the cursor restart
//     the read state.
//
// Not guaranteed: order when an identity sequence caches values (CACHE > 1:
// ids are then not allocated in time order across sessions). The whole
// read path: docs/design.md, "The read path".

// reader is one term's place in the outbox: the mechanisms above, tied
// together by fetch. It is used by the lead goroutine only (batch runs
// serially), so it needs no lock.
type reader struct {
	fence    store.Fence
	loaded   bool
	loadCold bool // load with store.ColdCursor, ignoring the saved cursor (rewind.go)
	cur      readCursor
	gaps     gapWatch
	parked   parkedSet
	late     lateCommits
	rescan   rescanPacer
	coldPass coldPass
	epoch    epochWatch
}

// readerFor returns the term's reader, a new one when the term changed.
func (p *Poller) readerFor(f store.Fence) *reader {
	if p.rd == nil || p.rd.fence != f {
		p.rd = &reader{fence: f, parked: parkedSet{},
			late: lateCommits{sent: sentMemory{last: map[store.Aggregate]int64{}, limit: p.maxLastSent}, warned: map[int64]struct{}{}}}
	}
	return p.rd
}

// fetch reads the next batch's rows from the term's place and moves it on.
// held says rows were read that wait behind an earlier id (a gap).
func (p *Poller) fetch(ctx context.Context, f store.Fence, lim store.FetchLimits) (rows []store.Row, held bool, err error) {
	r := p.readerFor(f)
	if !r.loaded {
		if err := p.load(ctx, r); err != nil {
			return nil, false, err
		}
	}
	below := r.cur.at // rows taken at or below it come from below the cursor, not from the scan
	res, err := p.store.Read(ctx, lim, p.pos(r, time.Now()))
	if err != nil {
		return nil, false, err
	}
	if reason, cold := p.idsReused(r, res); reason != "" {
		// New rows reuse ids at or below the cursor, where the scan would
		// never look: start again (see rewind.go).
		p.m.ReadRestarts.WithLabelValues(reason).Inc()
		p.rd = nil
		p.readerFor(f).loadCold = cold
		return nil, true, nil
	}
	r.gaps.holdBack(&res)
	r.cur.noteInflight(lim.Skip, res.Rows)
	p.advance(r, res, lim.Rows, time.Now())
	p.checkTaken(ctx, r, res.Rows, below)
	if err := p.maintain(ctx, r, len(res.Rows) == 0, res.XMin); err != nil {
		// Saving the cursor or a rescan step failed: the read itself stands;
		// a stale fence shows again on the batch's write.
		p.log.Warn("read path upkeep failed", "error", err)
	}
	return res.Rows, anyHeld(res.Hot), nil
}

// load starts the term's reader from the cursor its predecessor saved
// (store.LoadCursor: fenced, conservative: parked aggregates, watched gaps
// and rows in flight folded in), or a computed one when none is saved.
func (p *Poller) load(ctx context.Context, r *reader) error {
	load := p.store.LoadCursor
	if r.loadCold {
		load = p.store.ColdCursor
	}
	c, sent, horizon, epoch, err := load(ctx, r.fence.Lock)
	if err != nil {
		return err
	}
	now := time.Now()
	r.cur = readCursor{at: c, frontier: c, saved: c, savedSent: sent, savedOwed: horizon}
	r.coldPass = coldPass{to: c, horizon: horizon, owed: horizon, at: now}
	r.epoch.epoch = epoch
	r.late.inherited.lo, r.late.sent.handed = c, sent
	r.rescan.lo, r.rescan.to, r.rescan.at = 0, c, now
	if horizon != 0 {
		// LoadCursor's own walk saw every row visible at the start (or the
		// predecessor's term-start pass did): a pass now would find nothing
		// new; the cold pass at the horizon will.
		r.rescan.to = 0
		// Computed: saved at the first read, moved or not, so that the
		// backlog count and the sweep stop taking a floor of their own
		// (store.Store.SweepFloor).
		r.cur.saved = math.MinInt64
	}
	r.loaded = true
	p.log.Info("read path starts", "cursor", c, "sent", sent, "cold_horizon", horizon)
	return nil
}

// pos is what Read needs from r: the cursor, the gaps to look up and hold
// by (gapWatch.watch) and the parked aggregates.
func (p *Poller) pos(r *reader, now time.Time) store.ReadPos {
	pos := store.ReadPos{Cursor: r.cur.at, Frontier: r.cur.frontier}
	r.gaps.watch(&pos, now, p.cfg.GapWait)
	pos.Parked = r.parked.list()
	if n := int64(len(pos.Watch)); n > p.watchedMost.Load() {
		p.watchedMost.Store(n) // the lead goroutine is its only writer
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
func (p *Poller) advance(r *reader, res store.ReadResult, limit int, now time.Time) {
	slices.SortFunc(res.Rows, func(a, b store.Row) int { return cmp.Compare(a.ID, b.ID) })
	slices.SortFunc(res.Hot, func(a, b store.HotRow) int { return cmp.Compare(a.ID, b.ID) })
	// The read's answer for the parked aggregates goes first: a gap found
	// visible below parks its aggregate at the gap, lower than the answer.
	r.answerParked(res.Parked)
	p.gapsVisible(r, res, now)
	p.settleGaps(r, res.XMin, now)
	p.addGaps(r, res, now)
	r.cur.move(res, limit, r.gaps.runs)
	r.parkPassed(res.Hot)
}

// answerParked applies a read's first row of each parked aggregate; one
// with none left is dropped.
func (r *reader) answerParked(first map[store.Aggregate]int64) {
	for a, id := range first {
		if id == 0 {
			delete(r.parked, a)
			r.late.forgetFound(a)
		} else {
			r.parked[a] = id
		}
	}
}

// gapsVisible takes the watched gaps a read found visible out of the
// watch: a late commit when one given up is pending (lateCommits), parked
// when pending below the cursor (found again through its aggregate until
// sent).
func (p *Poller) gapsVisible(r *reader, res store.ReadResult, now time.Time) {
	seen := func(id int64, a store.Aggregate, pending bool) {
		g, ok := r.gaps.runs.remove(id)
		if !ok {
			return
		}
		if g.givenUp && pending {
			p.gapCommitted(r, g, id, a, now)
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
func (p *Poller) settleGaps(r *reader, xmin uint64, now time.Time) {
	for _, g := range r.gaps.settle(xmin, now, p.cfg.GapWait, r.late.sent.gen) {
		p.m.GapsGivenUp.Add(float64(g.size()))
		p.log.Debug("gap given up", "outbox_id", g.lo, "to_id", g.hi, "waited_ms", now.Sub(g.seen).Milliseconds())
	}
}

// addGaps watches a read's new gaps.
func (p *Poller) addGaps(r *reader, res store.ReadResult, now time.Time) {
	if len(res.NewGaps) > 0 {
		r.gaps.runs.add(res.NewGaps, gapState{horizon: res.XMax, seen: now})
		if len(res.NewGaps) <= watchOldPerRead {
			for _, id := range res.NewGaps {
				p.log.Debug("waiting for an earlier id", "outbox_id", id)
			}
		} else { // a bulk transaction's: a line a read, not one per id
			p.log.Debug("waiting for earlier ids", "outbox_id", slices.Min(res.NewGaps), "to_id", slices.Max(res.NewGaps), "gaps", len(res.NewGaps))
		}
	}
	r.gaps.runs.merge()
	p.gapRuns.Store(int64(len(r.gaps.runs)))
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
func (p *Poller) checkTaken(ctx context.Context, r *reader, rows []store.Row, below int64) {
	late, err := r.late.inheritedLate(ctx, p.store, p.maxInherit, rows)
	for _, l := range late {
		p.warnLate(l)
	}
	if err != nil {
		// The rows are delivered all the same; only a WARN may be missing.
		p.log.Warn("late commit check failed", "error", err)
	}
	r.late.noteRescued(rows, below)
	for _, row := range rows {
		r.late.sent.note(store.Aggregate{Type: row.AggregateType, ID: row.AggregateID}, row.ID)
	}
}

// sent records what a batch delivered and parks what it left pending below
// the cursor (an aggregate stopped, a newer holder's claim), so the next
// reads find it again. Called once the batch's outcomes are known.
func (r *reader) sent(items []item) {
	for _, it := range items {
		a := aggregateOf(it)
		switch it.outcome {
		case sent, duplicate:
			r.late.sent.note(a, it.row.ID)
		case pending, foreign:
			if it.row.ID <= r.cur.at {
				r.parked.park(a, it.row.ID)
			}
		}
	}
}

// unread brings rows fetched but not handled back above the cursor.
func (p *Poller) unread(f store.Fence, rows []store.Row) {
	ids := make([]int64, len(rows))
	for i, r := range rows {
		ids[i] = r.ID
	}
	p.readerFor(f).cur.rewind(ids)
}

// saveable is the cursor a successor may start from.
func (r *reader) saveable() int64 { return r.cur.saveable(r.parked, r.gaps.runs) }

// maintain starts a cold or periodic pass below the cursor when one is
// due, saves the cursor (at most every saveEvery), and runs a rescan step
// when the pacer allows one.
func (p *Poller) maintain(ctx context.Context, r *reader, idle bool, xmin uint64) error {
	now := time.Now()
	r.startColdPass(xmin, now, p.rescanEvery)
	if err := p.saveCursor(ctx, r, now); err != nil {
		return err
	}
	r.rescan.startEvery(now, p.rescanEvery, r.cur.at)
	lo, hi, ok := r.rescan.due(now, idle)
	if !ok {
		return nil
	}
	return p.rescanStep(ctx, r, lo, hi)
}

// startColdPass starts the cold pass when it is due and no pass runs.
func (r *reader) startColdPass(xmin uint64, now time.Time, every time.Duration) {
	if r.rescan.passing() {
		return
	}
	if to, timer, ok := r.coldPass.due(xmin, now, every, r.cur.at); ok {
		r.rescan.lo, r.rescan.to = 0, to
		if timer {
			r.rescan.at = now
		}
	}
	if !r.rescan.passing() {
		r.coldPass.idle()
	}
}

// saveCursor saves the cursor a successor may start from when it, the sent
// mark or the cold pass owed moved (the sent mark too: while a given-up gap
// holds the cursor still, rows of its aggregate above it go out, and a
// successor needs the mark to warn when the gap commits).
func (p *Poller) saveCursor(ctx context.Context, r *reader, now time.Time) error {
	c, sent, owed := r.saveable(), r.late.sent.mark(), r.coldPass.owed
	if !r.cur.saveDue(c, sent, owed, now) {
		return nil
	}
	if err := p.store.SaveCursor(ctx, r.fence, c, sent, owed, r.epoch.epoch); err != nil {
		return fmt.Errorf("save cursor: %w", err)
	}
	r.cur.savedAs(c, sent, owed, now)
	return nil
}

// rescanStep looks at (lo, hi] below the cursor and parks what it finds
// pending there; what the term did not know of (a row that re-entered the
// pending set, or a late commit whose gap is no longer watched) is noted
// for the late-commit check below the cursor.
func (p *Poller) rescanStep(ctx context.Context, r *reader, lo, hi int64) error {
	start := time.Now() // the step's own cost, not the cursor save's
	found, err := p.store.PendingBetween(ctx, lo, hi)
	if err != nil {
		return err
	}
	for _, f := range found {
		if cur, ok := r.parked[f.Aggregate]; (!ok || f.MinID < cur) && r.gaps.runs.find(f.MinID) < 0 {
			r.late.noteFound(f.Aggregate, f.MinID)
		}
		r.parked.park(f.Aggregate, f.MinID)
	}
	p.rescanned.Add(hi - lo)
	r.rescan.took(hi, start, time.Now())
	return nil
}
