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
// producers race.
//
// Guarantees (tested in readpath_test.go):
//   - Cost: each fetch scans from the cursor up (store.Read). Every id at or
//     below the cursor is delivered, dead, backing off (found through
//     outbox_delayed_idx when due), in a parked aggregate, or a watched gap.
//     Rows delivered before, and their index entries that a snapshot held
//     elsewhere keeps from vacuum, are never walked again.
//   - Order with racing producers: a row read above an id that is not
//     visible (a gap: a producer that took the id earlier and has not
//     committed, or rolled back) is not sent while the gap may still commit:
//     until every transaction in progress at the read that first missed it
//     has ended (snapshot xmin), or GapWait has passed. A rolled-back gap
//     therefore settles as soon as its transaction ends.
//   - Late commits are delivered and never silent: a gap given up after
//     GapWait is still looked up by primary key until its transactions end
//     (and for lateWatch after that; while they run, once given up over
//     watchRecent ago, in turns: about watchOldPerRead such gaps per read,
//     each every k reads, so a long transaction elsewhere that keeps
//     rolled-back gaps from settling does not make every read probe them
//     all; consecutive gaps are one run, and a read looks up at most
//     maxWatchPerRead of the others, see gaps.go); when it commits after a later row of
//     its aggregate was sent, it is delivered with a WARN "late commit" and
//     counted in outboxd_late_commits_total. Across a change of holder as
//     well: each holder saves, beside its cursor, the highest id it and the
//     holders before it handed on (sent); a new holder checks each row it
//     takes above the cursor it loaded and at or below that mark once
//     (the range is read once a term, store.InheritedLate, whatever the
//     number of aggregates; store.LaterSent only for a row whose producer
//     was in flight then; see inheritedLate) and warns and counts it the
//     same way when a later row of its aggregate was already dispatched.
//     Rows the last holder never sent (it stopped first), and rows tried
//     before (retries, replayed dead rows), are not warned. And below the
//     cursor: a row no gap of the term watches (the gap was dropped after
//     lateWatch, or the row lies below the cursor the term loaded or
//     computed) that the rescan or a cold pass finds is checked once
//     (rescuedLate, once claimed) and warned and counted the same way;
//     not when Redis holds it delivered (a row set pending by hand).
//   - A new holder starts at the cursor its predecessor saved (fenced,
//     conservative: parked aggregates and watched gaps folded in), and a slow
//     rescan below the cursor (at term start, then every rescanEvery, in
//     steps paced by their own cost: none sooner than stepSpacing times the
//     last one's duration (at most maxStepPause after it), ids per step adapted to about stepTarget, so the
//     reads it shares the loop with are never held for long whatever the
//     history) finds rows that re-entered the pending set there by hand. Replayed rows (available_at = now()) are backing off by
//     definition and come through the delayed index at once.
//   - A holder with no saved cursor computes one (store.LoadCursor); a
//     producer in flight then whose id fell below it is found by one pass
//     over (0, computed cursor] once every transaction in flight at the
//     computation has ended (a read's xmin reached its horizon), and, while
//     one still runs, by a pass every rescanEvery. Never by passes back to
//     back: each walks the whole settled history, every dead index entry
//     of it while a snapshot is held elsewhere (see maintain).
//
// Not guaranteed: order when an identity sequence caches values (CACHE > 1:
// ids are then not allocated in time order across sessions), or when a
// producer is descheduled for longer than one poll between taking its id
// and its first write (it has no transaction id yet, so the read's snapshot
// cannot name it; lateWatch and the rescan still deliver its row, warned
// when late). Nor a WARN for a late row whose later sibling was sent above
// the saved sent mark by a holder that lost the lease before saving it (at
// most saveEvery of sends), or, for a row the rescan finds, whose later
// sibling was taken and not yet written when it was checked.

const (
	// lateWatch: how long a gap is still looked up after its transactions
	// ended without it becoming visible (see "Not guaranteed").
	lateWatch = 10 * time.Second
	// rescanEvery and rescanSpan pace the slow rescan below the cursor.
	rescanEvery = 5 * time.Minute
	rescanSpan  = 50_000
	// rescanPause: while busy, at most one rescan step per this.
	rescanPause = time.Second
	// A rescan step runs in the read loop, so it is paced by its own cost
	// too: after a step that took d, none before stepSpacing × d, idle or
	// not, and the ids per step (rescanFirst at first, then between
	// rescanMin and rescanSpan) adapt so that a step takes about
	// stepTarget. Steps used to run back to back on every idle read: under
	// a held snapshot a 50k-id step walks as many dead index entries, and a
	// pass over 1.2M ids stalled the read loop for about a second every
	// rescanEvery (p99 spikes in minutes 5 and 10 of a 10-minute run,
	// growing with history).
	stepSpacing = 20
	// maxStepPause caps that pause. A step's duration measures the
	// span's cost only while Postgres answers at its usual pace: one
	// step that waited on a lock or a stalled server (say 30 s) would
	// otherwise put the next off stepSpacing times as long (10 minutes,
	// two periods of rescanEvery). The span is halved after a slow step
	// anyway, so the next step is cheaper; the cap bounds what one stall
	// can cost a pass to rescanEvery/30, and the following steps are
	// paced by their own cost again.
	maxStepPause = rescanEvery / 30
	stepTarget   = 2 * time.Millisecond
	rescanFirst  = 5_000
	rescanMin    = 500
	// A gap given up more than watchRecent ago whose transactions still
	// run is looked up by only some reads: each read takes the ids whose
	// remainder mod k is its turn, k chosen so that about watchOldPerRead
	// of them go per read, and every one goes once every k reads. While a
	// transaction holding an xid runs anywhere in the cluster (a
	// long-running writer, a migration) no gap seen since can be settled
	// (its xmin stays below their horizon), so with producers rolling
	// back, the given-up gaps pile up for as long as it runs; looked up
	// all on every read, each read cost a primary-key probe per gap (201
	// gaps after 200 rollbacks behind one open transaction), growing
	// without bound. A late commit among them is still found, delivered
	// and warned, at most k reads later. Gaps not yet given up, recently
	// given up, or whose transactions ended (watched for lateWatch more)
	// are looked up by every read.
	watchRecent     = time.Second
	watchOldPerRead = 64
	// saveEvery: how often the cursor is saved while it moves.
	saveEvery = time.Second
	// maxLastSent bounds the per-aggregate memory of the highest id sent.
	maxLastSent = 100_000
	// maxInherit bounds the late rows and the missing ids a term keeps for
	// its inherited late-commit check (store.InheritedLate).
	maxInherit = 100_000
)

type gapState struct {
	horizon uint64    // store.Gap.Horizon
	seen    time.Time // first missed
	givenUp bool      // GapWait passed: rows above it are no longer held
	ended   time.Time // when its transactions were seen ended, invisible
	lastGen int       // reader.gen when given up
}

// reader is one term's place in the outbox. It is used by the lead
// goroutine only (batch runs serially), so it needs no lock.
type reader struct {
	fence     store.Fence
	loaded    bool
	cursor    int64
	frontier  int64
	gaps      gapSet                    // see gaps.go
	parked    map[store.Aggregate]int64 // lowest id
	lastSent  map[store.Aggregate]int64 // highest id sent, this term
	gen       int                       // bumped when lastSent is cleared
	reads     int64                     // reads so far (pos), whose turn it is among old gaps
	maxSent   int64
	saved     int64
	savedSent int64
	savedAt   time.Time
	// rescan below the cursor: (rescanLo, rescanTo] left to look at.
	rescanLo, rescanTo int64
	rescanAt, stepAt   time.Time
	stepSpan           int64         // ids the next step covers (0: rescanFirst)
	stepTook           time.Duration // the last step's duration
	// A cursor computed, not saved (store.LoadCursor): (0, coldTo] is
	// rescanned once a read's snapshot xmin reaches coldHorizon (and every
	// rescanEvery from coldAt before that), so a producer in flight at the
	// start whose id fell below it is found once it commits. 0: settled.
	// coldOwed is that horizon until the last cold pass has completed: it
	// is saved with the cursor, so a successor that takes over before then
	// owes the pass in its turn (store.SaveCursor); savedOwed, as saved.
	coldTo      int64
	coldHorizon uint64
	coldOwed    uint64
	savedOwed   uint64
	coldAt      time.Time
	// Late commits across a change of holder: rows taken in (inheritLo,
	// inherited] are checked once (inheritedLate) for a later row of
	// their aggregate the holders before this one dispatched. lateDone
	// holds the ids checked or already warned in this term.
	inheritLo, inherited int64
	lateDone             map[int64]struct{}
	// Late commits found below the cursor (noteRescued, rescuedLate):
	// rescued holds the aggregates a rescan step or a cold pass found
	// pending there that the term did not know of (neither parked nor a
	// watched gap), each with the lowest id found; lateCheck the rows of
	// theirs taken, to check once claimed.
	rescued     map[store.Aggregate]int64
	lateCheck   map[int64]struct{}
	epoch       string // the ids' epoch (store.ReadResult.Epoch) the cursor belongs to
	inflightLow int64  // lowest id fetched and not yet written, as of the last read

	// inherit: what the rows in (inheritLo, inherited] looked like when
	// the term first took a row there (store.InheritedLate): the late ones
	// and the ids missing then; nil while not loaded or when more of either
	// than p.maxInherit (then each read's rows go to store.LaterSent).
	inherit       *store.Inherited
	inheritLoaded bool

	// See rewind.go: the server the reads run on ("" before the first),
	// the lowest sequence value a read may see, and whether to load cold.
	incarnation string
	seqFloor    int64
	cold        bool

	// lastSentMax bounds lastSent (0: maxLastSent); tests lower it.
	lastSentMax int
}

// readerFor returns the term's reader, a new one when the term changed.
func (p *Poller) readerFor(f store.Fence) *reader {
	if p.rd == nil || p.rd.fence != f {
		p.rd = &reader{fence: f, parked: map[store.Aggregate]int64{},
			lastSent: map[store.Aggregate]int64{}, lateDone: map[int64]struct{}{}, lastSentMax: p.maxLastSent}
	}
	return p.rd
}

// fetch reads the next batch's rows from the term's place and moves it on.
// held says rows were read that wait behind an earlier id (a gap).
func (p *Poller) fetch(ctx context.Context, f store.Fence, lim store.FetchLimits) (rows []store.Row, held bool, err error) {
	r := p.readerFor(f)
	if !r.loaded {
		load := p.store.LoadCursor
		if r.cold {
			load = p.store.ColdCursor
		}
		c, sent, horizon, epoch, err := load(ctx, f.Lock)
		if err != nil {
			return nil, false, err
		}
		r.coldTo, r.coldHorizon, r.coldOwed, r.savedOwed, r.epoch = c, horizon, horizon, horizon, epoch
		r.inheritLo, r.inherited, r.savedSent = c, sent, sent
		r.cursor, r.frontier, r.saved, r.loaded = c, c, c, true
		r.rescanLo, r.rescanTo = 0, c
		if horizon != 0 {
			// LoadCursor's own walk saw every row visible at the start (or
			// the predecessor's term-start pass did): a pass now would find
			// nothing new; the cold pass at the horizon will (see maintain).
			r.rescanTo = 0
			// Computed: saved at the first read, moved or not, so that the
			// backlog count and the sweep stop taking a floor of their own
			// (a walk of a pending index each, store.Store.SweepFloor).
			r.saved = math.MinInt64
		}
		r.rescanAt, r.coldAt = time.Now(), time.Now()
		p.log.Info("read path starts", "cursor", c, "sent", sent, "cold_horizon", horizon)
	}
	below := r.cursor // rows taken at or below it come from below the cursor, not from the scan
	pos := r.pos(time.Now(), p.cfg.GapWait)
	if n := int64(len(pos.Watch)); n > p.watchedMost.Load() {
		p.watchedMost.Store(n) // the lead goroutine is its only writer
	}
	res, err := p.store.Read(ctx, lim, pos)
	if err != nil {
		return nil, false, err
	}
	if reason, cold := p.idsReused(r, res); reason != "" {
		// New rows reuse ids at or below the cursor, where the scan would
		// never look: start again (see rewind.go).
		p.m.ReadRestarts.WithLabelValues(reason).Inc()
		p.rd = nil
		p.readerFor(f).cold = cold
		return nil, true, nil
	}
	r.holdBack(&res)
	// Rows not written yet (in flight, or just taken) must stay above any
	// cursor a successor starts from: a crash before their write leaves
	// them pending.
	r.inflightLow = math.MaxInt64
	for _, id := range lim.Skip {
		r.inflightLow = min(r.inflightLow, id)
	}
	for _, row := range res.Rows {
		r.inflightLow = min(r.inflightLow, row.ID)
	}
	p.advance(r, res, lim.Rows, time.Now())
	if err := p.inheritedLate(ctx, r, res.Rows); err != nil {
		// The rows are delivered all the same; only a WARN may be missing.
		p.log.Warn("late commit check failed", "error", err)
	}
	r.noteRescued(res.Rows, below)
	// Taken rows count as sent from now on: a gap of their aggregate that
	// becomes visible while they are in flight goes after them, a late
	// commit (it was missed under load when only written results counted).
	for _, row := range res.Rows {
		r.noteSent(store.Aggregate{Type: row.AggregateType, ID: row.AggregateID}, row.ID)
	}
	for _, h := range res.Hot {
		held = held || h.State == store.HotHeld
	}
	if err := p.maintain(ctx, r, len(res.Rows) == 0, res.XMin); err != nil {
		// Saving the cursor or a rescan step failed: the read itself stands;
		// a stale fence shows again on the batch's write.
		p.log.Warn("read path upkeep failed", "error", err)
	}
	return res.Rows, held, nil
}

// pos is what Read needs from r: the gaps to look up, at most
// maxWatchPerRead of them holding, recently given up or swept, and of the
// gaps given up long ago those whose turn it is (see watchOldPerRead and
// gaps.go).
func (r *reader) pos(now time.Time, gapWait time.Duration) store.ReadPos {
	pos := store.ReadPos{Cursor: r.cursor, Frontier: r.frontier}
	r.reads++
	r.watch(&pos, now, gapWait)
	for a, id := range r.parked {
		pos.Parked = append(pos.Parked, store.Parked{Aggregate: a, MinID: id})
	}
	return pos
}

// advance takes in what a read saw: gaps settled, committed or given up,
// new gaps, the cursor moved past what is settled, rows passed parked.
//
// limit is the read's row limit, which also bounds its scan above the
// cursor: a scan that stopped there saw nothing beyond its last row, so the
// cursor may not pass that row, whatever an earlier, longer read classified
// (the frontier). Without this a short read after a long one moved the
// cursor over pending rows it never looked at, and they waited for the
// rescan while later rows of their aggregates went first.
func (p *Poller) advance(r *reader, res store.ReadResult, limit int, now time.Time) {
	slices.SortFunc(res.Rows, func(a, b store.Row) int { return cmp.Compare(a.ID, b.ID) })
	slices.SortFunc(res.Hot, func(a, b store.HotRow) int { return cmp.Compare(a.ID, b.ID) })

	// The parked aggregates' first rows, as the read found them from the
	// lowest ids it was given: before this read's gaps found visible park
	// their aggregates below them. Applied after, as it was, a parked
	// aggregate with nothing left from its old first row was dropped, or
	// moved up, over a row of it that a gap had just parked lower, and that
	// row waited for the rescan (TestBulkTransactionGapsAreBounded: 11,600
	// of 30,000 rows of a bulk that committed late).
	for a, first := range res.Parked {
		if first == 0 {
			delete(r.parked, a)
			delete(r.rescued, a)
		} else {
			r.parked[a] = first
		}
	}
	// Gaps that became visible: a late commit if given up and a later row
	// of its aggregate went first.
	seen := func(id int64, a store.Aggregate, pending bool) {
		g, ok := r.gaps.remove(id)
		if !ok {
			return
		}
		if g.givenUp && pending {
			p.lateCommit(r, &g, id, a, now)
		}
		if pending && id <= r.cursor {
			r.park(a, id) // found again through its aggregate until sent
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
	p.settle(r, res.XMin, now)
	if len(res.NewGaps) > 0 {
		r.gaps.add(res.NewGaps, gapState{horizon: res.XMax, seen: now})
		if len(res.NewGaps) <= watchOldPerRead {
			for _, id := range res.NewGaps {
				p.log.Debug("waiting for an earlier id", "outbox_id", id)
			}
		} else { // a bulk transaction's: a line a read, not one per id
			p.log.Debug("waiting for earlier ids", "outbox_id", slices.Min(res.NewGaps), "to_id", slices.Max(res.NewGaps), "gaps", len(res.NewGaps))
		}
	}
	r.gaps.merge()
	p.gapRuns.Store(int64(len(r.gaps)))
	r.frontier = max(r.frontier, res.Classified)

	// The cursor: up to what is classified, below every gap still holding
	// and below the first row read that is neither taken nor settled.
	c := r.frontier
	for i := range r.gaps {
		if g := &r.gaps[i]; g.holding() && g.hi > r.cursor {
			c = min(c, max(g.lo, r.cursor+1)-1)
		}
	}
	for _, h := range res.Hot {
		if h.State == store.HotHeld || h.State == store.HotCut {
			c = min(c, h.ID-1)
			break
		}
	}
	scanned, last := 0, int64(0)
	for _, h := range res.Hot {
		scanned, last = scanned+1, max(last, h.ID)
	}
	for _, row := range res.Rows {
		if row.ID > r.cursor { // taken from the scan, not from below the cursor
			scanned, last = scanned+1, max(last, row.ID)
		}
	}
	if limit > 0 && scanned >= limit {
		c = min(c, last)
	}
	r.cursor = max(r.cursor, c)

	for _, h := range res.Hot {
		if h.ID <= r.cursor && (h.State == store.HotBlocked || h.State == store.HotBusy) {
			r.park(h.Aggregate, h.ID)
		}
	}
}

// park notes that aggregate a has a pending row at or below the cursor
// from id on.
func (r *reader) park(a store.Aggregate, id int64) {
	if cur, ok := r.parked[a]; !ok || id < cur {
		r.parked[a] = id
	}
}

// lateCommit reports a gap that committed after it was given up.
func (p *Poller) lateCommit(r *reader, g *gapState, id int64, a store.Aggregate, now time.Time) {
	after, known := r.lastSent[a]
	if !known && g.lastGen == r.gen {
		// Nothing of its aggregate was sent since the gap was given up: its
		// order holds, only its latency suffered.
		p.log.Info("gap committed after poller.gap_wait, order kept", "outbox_id", id,
			"waited_ms", now.Sub(g.seen).Milliseconds())
		return
	}
	if known && after < id {
		p.log.Info("gap committed after poller.gap_wait, order kept", "outbox_id", id,
			"waited_ms", now.Sub(g.seen).Milliseconds())
		return
	}
	if !known {
		after = r.maxSent
	}
	if r.lateDone == nil {
		r.lateDone = map[int64]struct{}{}
	}
	r.lateDone[id] = struct{}{} // warned once, not again by inheritedLate or rescuedLate
	p.m.LateCommits.Inc()
	p.log.Warn("late commit", "aggregate_type", a.Type, "aggregate_id", a.ID, "outbox_id", id, "after_id", after,
		"waited_ms", now.Sub(g.seen).Milliseconds())
}

// inheritedLate warns for and counts each row taken in (r.inheritLo,
// r.inherited] that committed after an earlier holder dispatched a later
// row of its aggregate: a late commit the in-term watch (lateCommit) cannot
// see, since the gap was given up by the holder before this one. Each id
// is checked once a term; reads that take no such row cost nothing.
//
// Cost: one store.InheritedLate a term (one walk of the range) says which
// rows visible then are late and which ids were missing; a row is then
// settled in memory, and only a row at an id missing then (its producer
// was in flight) goes to store.LaterSent. The memory is the late rows and
// the missing ids, not the aggregates: DispatchedAbove held every
// aggregate dispatched in the range, up to maxLastSent, and with more (one
// event per order) each read walked up to the mark in LaterSent again, a
// quadratic drain (TestBacklogDrainOverManyAggregatesChecksOnce). A walk
// per read made a 1M-row backlog drain walk the backlog once a read
// (TestBacklogDrainChecksInheritedRowsOnce).
func (p *Poller) inheritedLate(ctx context.Context, r *reader, rows []store.Row) error {
	unchecked := func(row store.Row) bool {
		_, done := r.lateDone[row.ID]
		return !done && row.ID > r.inheritLo && row.ID <= r.inherited
	}
	first := slices.IndexFunc(rows, unchecked)
	if first < 0 {
		return nil
	}
	if !r.inheritLoaded {
		in, complete, err := p.store.InheritedLate(ctx, r.inheritLo, r.inherited, p.maxInherit)
		if err != nil {
			return fmt.Errorf("late commit check: %w", err)
		}
		r.inheritLoaded = true
		if complete {
			r.inherit = in
		}
	}
	// Only the rows the query must settle are copied: copying every row of
	// the range first made a drain onto a backlog copy each row it read
	// (550 kB a batch of 1,000).
	var check []store.Row
	in := r.inherit
	for _, row := range rows[first:] {
		if !unchecked(row) {
			continue
		}
		if in != nil {
			// A row visible at the term's check is settled by it: late when
			// named in Late (warned once), else not. The rest (in flight
			// then) need the query.
			if after, ok := in.Late[row.ID]; ok {
				p.warnLate(r, row, after)
				continue
			}
			if !in.InHole(row.ID) {
				continue
			}
		}
		check = append(check, row)
	}
	if len(check) == 0 {
		return nil
	}
	later, err := p.store.LaterSent(ctx, check, r.inherited)
	if err != nil {
		return fmt.Errorf("late commit check: %w", err)
	}
	for _, row := range check {
		r.lateDone[row.ID] = struct{}{}
		if after, ok := later[row.ID]; ok {
			p.warnLate(r, row, after)
		}
	}
	return nil
}

// warnLate warns for and counts row, late (after: the later row of its
// aggregate this holder or an earlier one dispatched), once a term.
func (p *Poller) warnLate(r *reader, row store.Row, after int64) {
	r.lateDone[row.ID] = struct{}{}
	p.warnLateRow(row, after)
}

// warnLateRow is warnLate's line and count, for a row already in lateDone.
func (p *Poller) warnLateRow(row store.Row, after int64) {
	p.m.LateCommits.Inc()
	p.log.Warn("late commit", "aggregate_type", row.AggregateType, "aggregate_id", row.AggregateID,
		"outbox_id", row.ID, "after_id", after, "waited_ms", time.Since(row.CreatedAt).Milliseconds())
}

// noteRescued marks, among rows taken from below the cursor (at or below
// below), those a rescan step or a cold pass found there (r.rescued), not
// tried before: a row whose gap the term no longer watched (its producer
// took the id before its transaction had an id the snapshot could name,
// and wrote it after lateWatch), or whose producer was in flight when the
// term, or the holder before it, computed its cursor. The in-term watch
// (lateCommit) cannot see them: no gap is left; nor inheritedLate: they
// lie below the cursor loaded. rescuedLate checks them once claimed. Each
// id is marked once a term.
func (r *reader) noteRescued(rows []store.Row, below int64) {
	if len(r.rescued) == 0 {
		return
	}
	for _, row := range rows {
		lo, ok := r.rescued[store.Aggregate{Type: row.AggregateType, ID: row.AggregateID}]
		if _, done := r.lateDone[row.ID]; !ok || done || row.ID < lo || row.ID > below || row.Attempts != 0 {
			continue
		}
		if r.lateDone == nil {
			r.lateDone = map[int64]struct{}{}
		}
		if r.lateCheck == nil {
			r.lateCheck = map[int64]struct{}{}
		}
		r.lateDone[row.ID] = struct{}{}
		r.lateCheck[row.ID] = struct{}{}
	}
}

// rescuedLate warns for and counts each row of a claimed batch that
// noteRescued marked and that has a later row of its aggregate already
// dispatched (store.LaterSent, one range walk from the lowest such row to
// the sent mark, only for batches that hold one: the rescan finds such
// rows rarely). Not the rows Redis holds as delivered: a row an operator
// set pending again by hand (UPDATE ... SET dispatched_at = NULL) looks
// untried in Postgres, but it was sent in its turn and is only marked now,
// and checked after the claim it costs no walk.
//
// The walk costs about a millisecond per 1,000 ids between the row and the
// mark (a row set pending by hand long after its mark expired: 2.3 s behind
// 2M ids), so it runs off the lead goroutine (pipeline.walkLate) on a view
// taken here, before the batch is sent: it sees what the lead would have
// seen, and the batch and the ones after it go meanwhile. One walk at a
// time (it holds a pooled connection); a batch that finds one running
// returns an error naming its rows: the rows go all the same, and the line
// says which were not checked.
func (p *Poller) rescuedLate(ctx context.Context, pl *pipeline, r *reader, items []item) error {
	if len(r.lateCheck) == 0 {
		return nil
	}
	var check []store.Row
	for _, it := range items {
		if _, ok := r.lateCheck[it.row.ID]; !ok {
			continue
		}
		delete(r.lateCheck, it.row.ID)
		if it.outcome != duplicate && it.outcome != poisoned {
			check = append(check, it.row)
		}
	}
	if len(check) == 0 {
		return nil
	}
	return pl.walkLate(ctx, check, max(r.inherited, r.maxSent))
}

// walkLate starts the late-commit walk of rescuedLate's rows on a view
// taken now, owned by the pipeline (close waits for it, and cancels it
// once every result is written: a walk cut short says so). Only the view
// is taken on the caller's goroutine, within the lease's trust deadline.
func (pl *pipeline) walkLate(ctx context.Context, check []store.Row, sent int64) error {
	ids := make([]int64, len(check))
	for i, row := range check {
		ids[i] = row.ID
	}
	select {
	case pl.lateWalk <- struct{}{}:
	default:
		return fmt.Errorf("late commit check of outbox ids %v skipped: the check of earlier rows is still running", ids)
	}
	vctx, cancel := context.WithDeadline(ctx, pl.trusted())
	view, err := pl.p.store.View(vctx)
	cancel()
	if err != nil {
		<-pl.lateWalk
		return fmt.Errorf("late commit check of outbox ids %v: %w", ids, err)
	}
	pl.lateWalks.Go(func() {
		defer func() {
			view.Close()
			<-pl.lateWalk
			fire(pl.p.hooks.lateWalked)
		}()
		fire(pl.p.hooks.lateWalk)
		later, err := view.LaterSent(pl.ctx, check, sent)
		if err != nil {
			pl.p.log.Warn("late commit check failed", "error", fmt.Errorf("outbox ids %v: %w", ids, err))
			return
		}
		for _, row := range check {
			if after, ok := later[row.ID]; ok {
				pl.p.warnLateRow(row, after)
			}
		}
	})
	return nil
}

// sent records what a batch delivered and parks what it left pending below
// the cursor (an aggregate stopped, a newer holder's claim), so the next
// reads find it again. Called once the batch's outcomes are known.
func (r *reader) sent(items []item) {
	for _, it := range items {
		a := aggregateOf(it)
		switch it.outcome {
		case sent, duplicate:
			r.noteSent(a, it.row.ID)
		case pending, foreign:
			if it.row.ID <= r.cursor {
				r.park(a, it.row.ID)
			}
		}
	}
}

// noteSent records that id of aggregate a is sent (or on its way).
func (r *reader) noteSent(a store.Aggregate, id int64) {
	limit := r.lastSentMax
	if limit == 0 {
		limit = maxLastSent
	}
	if _, ok := r.lastSent[a]; !ok && len(r.lastSent) >= limit {
		clear(r.lastSent)
		r.gen++
	}
	r.lastSent[a] = max(r.lastSent[a], id)
	r.maxSent = max(r.maxSent, id)
}

// unread brings rows fetched but not handled back above the cursor.
func (p *Poller) unread(f store.Fence, rows []store.Row) {
	ids := make([]int64, len(rows))
	for i, r := range rows {
		ids[i] = r.ID
	}
	p.readerFor(f).rewind(ids)
}

// rewind brings rows of a batch whose results were not written back above
// the cursor, so the next reads find them again.
func (r *reader) rewind(ids []int64) {
	if len(ids) > 0 {
		r.cursor = min(r.cursor, slices.Min(ids)-1)
	}
}

// saveable is the cursor a successor may start from: below every parked
// row and every gap still watched.
func (r *reader) saveable() int64 {
	c := min(r.cursor, r.inflightLow-1)
	for _, id := range r.parked {
		c = min(c, id-1)
	}
	if len(r.gaps) > 0 {
		c = min(c, r.gaps[0].lo-1)
	}
	return c
}

// maintain saves the cursor (at most every saveEvery) and runs a rescan
// step below it when one is due: at once when the read was idle, otherwise
// at most every rescanPause.
func (p *Poller) maintain(ctx context.Context, r *reader, idle bool, xmin uint64) error {
	now := time.Now()
	// The cold pass. A computed cursor is right for every row visible in
	// LoadCursor's snapshot; only a producer in flight then can still add
	// a row below it. Once they all ended (xmin >= coldHorizon), one pass
	// finds what they left. Before that a pass runs at most every
	// rescanEvery (a long transaction must not hide a row for ever): back
	// to back, passes walked the whole history (under a held snapshot, each
	// of its dead index entries, ~2,600 buffers per 50k ids) for as long as
	// any transaction of the cluster that was open at the start ran.
	if r.coldHorizon != 0 && r.rescanLo >= r.rescanTo {
		switch {
		case xmin >= r.coldHorizon:
			r.rescanLo, r.rescanTo, r.coldHorizon = 0, r.coldTo, 0 // the last cold pass
		case now.Sub(r.coldAt) >= p.rescanEvery:
			// It is the periodic pass too (both timers start at the load):
			// run after it, that one walked the same history again at once
			// (TestColdTimerPassIsTheTermsPass).
			r.rescanLo, r.rescanTo, r.coldAt, r.rescanAt = 0, max(r.coldTo, r.cursor), now, now
		}
	}
	if r.coldOwed != 0 && r.coldHorizon == 0 && r.rescanLo >= r.rescanTo {
		r.coldOwed = 0 // the last cold pass has completed
	}
	// The sent mark is saved when it moves too: while a given-up gap holds
	// the cursor still, rows of its aggregate above it go out, and a
	// successor needs the mark to warn when the gap commits.
	c, sentTo := r.saveable(), max(r.inherited, r.maxSent)
	if (c != r.saved || sentTo != r.savedSent || r.coldOwed != r.savedOwed) && now.Sub(r.savedAt) >= saveEvery {
		if err := p.store.SaveCursor(ctx, r.fence, c, sentTo, r.coldOwed, r.epoch); err != nil {
			return fmt.Errorf("save cursor: %w", err)
		}
		r.saved, r.savedSent, r.savedOwed, r.savedAt = c, sentTo, r.coldOwed, now
	}
	if r.rescanLo >= r.rescanTo && now.Sub(r.rescanAt) >= p.rescanEvery {
		r.rescanLo, r.rescanTo, r.rescanAt = 0, r.cursor, now
	}
	if r.rescanLo >= r.rescanTo || now.Sub(r.stepAt) < min(stepSpacing*r.stepTook, maxStepPause) ||
		(!idle && now.Sub(r.stepAt) < rescanPause) {
		return nil
	}
	if r.stepSpan == 0 {
		r.stepSpan = rescanFirst
	}
	hi := min(r.rescanLo+r.stepSpan, r.rescanTo)
	// The step's own cost: not the cursor save above, which a busy read
	// loop makes beside nearly every step (counted in, it pinned the span
	// at rescanMin; TestRescanStepIsJudgedByItsOwnCost).
	start := time.Now()
	found, err := p.store.PendingBetween(ctx, r.rescanLo, hi)
	if err != nil {
		return err
	}
	for _, f := range found {
		if cur, ok := r.parked[f.Aggregate]; (!ok || f.MinID < cur) && r.gaps.find(f.MinID) < 0 {
			// Not known to the term: a row that re-entered the pending
			// set, or a late commit whose gap is no longer watched.
			if lo, ok := r.rescued[f.Aggregate]; !ok || f.MinID < lo {
				if r.rescued == nil {
					r.rescued = map[store.Aggregate]int64{}
				}
				r.rescued[f.Aggregate] = f.MinID
			}
		}
		r.park(f.Aggregate, f.MinID)
	}
	p.rescanned.Add(hi - r.rescanLo)
	r.stepAt = time.Now()
	r.stepTook = r.stepAt.Sub(start)
	switch {
	case r.stepTook > 2*stepTarget:
		r.stepSpan = max(r.stepSpan/2, rescanMin)
	case r.stepTook < stepTarget/2:
		r.stepSpan = min(r.stepSpan*2, rescanSpan)
	}
	r.rescanLo = hi
	return nil
}
