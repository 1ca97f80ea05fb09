package poller

import (
	"math"
	"slices"
	"time"

	"github.com/outboxd/outboxd/store"
)

// gapWatch holds a term's watched gaps: ids below a visible row that were
// not visible when first read (a producer that took the id earlier and has
// not committed, or rolled back). Rows read above a gap are not sent while
// it may still commit: until every transaction in progress at the read
// that first missed it has ended (snapshot xmin past its horizon), or
// gap_wait has passed (then it is given up). A rolled-back gap therefore
// settles as soon as its transactions end.
//
// A gap given up is still looked up by primary key until its transactions
// end, and for lateWatch after that, so that a late commit is delivered
// and reported (lateCommits). While its transactions run, a gap given up
// over watchRecent ago is looked up in turns: about watchOldPerRead such
// ids per read, each every k reads, so a long transaction elsewhere that
// keeps rolled-back gaps from settling does not make every read probe them
// all.
//
// Gaps are kept as runs of consecutive ids that share one state, so that
// what a term keeps, and what each read does, depends on the number of
// runs, not of ids (one producer transaction inserting N rows leaves N
// consecutive gaps). A read looks up at most maxWatchPerRead ids of the
// runs holding, given up recently or swept, and about watchOldPerRead of
// the runs given up long ago; the other ids of a run holding stay holding
// unlooked at (a marker: the first id not looked up is passed as holding,
// so the hold is never lower than the truth). A run is swept,
// maxWatchPerRead ids a read from its lowest, when its transactions ended
// (pass after pass until lateWatch passed and one pass was done), and for
// one pass when one of its ids was found visible (its transaction
// committed: the rest of its rows most likely with it).
//
// Not bounded: gaps that are not consecutive (a batch job inserting one
// row per statement while other producers commit between them) are a run
// each: the memory is a run per gap and each read walks the runs in
// memory (no more lookups than the bound). Not guaranteed: order when a
// producer is descheduled for longer than one poll between taking its id
// and its first write (it has no transaction id yet, so the read's
// snapshot cannot name it; lateWatch and the rescan still deliver its row,
// reported when late). docs/design.md, "Order when producers race".
type gapWatch struct {
	runs  gapSet
	reads int64 // reads so far: whose turn it is among old runs
}

// visible takes id out of the watch: it became visible. It returns the
// state of its run, or ok false when id is not watched.
func (w *gapWatch) visible(id int64) (gapState, bool) { return w.runs.remove(id) }

// found watches a read's new gaps ids, and joins adjacent runs of one kind.
func (w *gapWatch) found(ids []int64, st gapState) {
	if len(ids) > 0 {
		w.runs.add(ids, st)
	}
	w.runs.merge()
}

// watches says whether id is a watched gap.
func (w *gapWatch) watches(id int64) bool { return w.runs.find(id) >= 0 }

// set is the watched gaps, for the cursor (readCursor.move, saveable).
func (w *gapWatch) set() gapSet { return w.runs }

const (
	// lateWatch is how long a gap is still looked up after its
	// transactions ended without it becoming visible.
	lateWatch = 10 * time.Second
	// watchRecent is how long after its give-up a gap whose transactions
	// run is still looked up by every read; later, in turns.
	watchRecent = time.Second
	// watchOldPerRead is about how many ids of runs given up long ago one
	// read looks up.
	watchOldPerRead = 64
	// maxWatchPerRead bounds the ids of runs holding, recently given up or
	// swept that one read looks up (primary-key probes); old runs add
	// about watchOldPerRead. It is about a fetch of a full batch's work.
	maxWatchPerRead = 4096
)

// gapState is what a run of gaps shares.
type gapState struct {
	horizon uint64    // store.Gap.Horizon
	seen    time.Time // first missed
	givenUp bool      // gap_wait passed: rows above it are no longer held
	ended   time.Time // when its transactions were seen ended, invisible
	lastGen int       // sentMemory.gen when given up
}

// gapRun is the gaps lo to hi, consecutive ids that share one state.
type gapRun struct {
	lo, hi int64
	gapState
	sweeping bool  // looked up from next on, maxWatchPerRead ids a read at most
	next     int64 // the sweep's next id (in [lo, hi+1])
	win      int64 // the highest id of the sweep this read looks up (0: none)
	passes   int   // sweeps completed since its transactions ended
	turned   bool  // this read looks it up in turns (scattered ids)
}

func (g *gapRun) size() int64 { return g.hi - g.lo + 1 }

// gapSet is a term's watched gaps: runs sorted by id, disjoint.
type gapSet []gapRun

// find returns the index of the run holding id, or -1.
func (s gapSet) find(id int64) int {
	i, _ := slices.BinarySearchFunc(s, id, func(g gapRun, id int64) int {
		switch {
		case g.hi < id:
			return -1
		case g.lo > id:
			return 1
		}
		return 0
	})
	if i < len(s) && s[i].lo <= id && id <= s[i].hi {
		return i
	}
	return -1
}

// remove takes id out of s (it became visible), splitting its run, and
// returns its state. The rest of a run not swept already is swept once
// (see the type's comment).
func (s *gapSet) remove(id int64) (gapState, bool) {
	i := s.find(id)
	if i < 0 {
		return gapState{}, false
	}
	g := &(*s)[i]
	st := g.gapState
	if !g.sweeping {
		g.sweeping, g.next = true, g.lo
	}
	switch {
	case g.lo == g.hi:
		*s = slices.Delete(*s, i, i+1)
		return st, true
	case id == g.lo:
		g.lo++
	case id == g.hi:
		g.hi--
	default:
		upper := *g
		upper.lo, g.hi = id+1, id-1
		*s = slices.Insert(*s, i+1, upper)
		g = &(*s)[i]
		(*s)[i+1].next = max((*s)[i+1].next, id+1)
	}
	g.next = min(max(g.next, g.lo), g.hi+1)
	return st, true
}

// add appends the new gaps ids (all above every run of s) as runs.
func (s *gapSet) add(ids []int64, st gapState) {
	slices.Sort(ids)
	for _, id := range ids {
		if n := len(*s); n > 0 && (*s)[n-1].hi == id-1 && (*s)[n-1].gapState == st {
			(*s)[n-1].hi = id
			continue
		}
		*s = append(*s, gapRun{lo: id, hi: id, gapState: st})
	}
}

// merge joins adjacent runs of one kind: both holding (the later horizon
// and first-missed time: held as long as either would be), or both given up
// and not swept (the later horizon, the later first-missed time and the
// earlier generation: looked up as long as either would be, and a late
// commit warned when either would warn). Runs whose transactions ended are
// left apart: they go once swept.
func (s *gapSet) merge() {
	out := (*s)[:0]
	for _, g := range *s {
		if n := len(out); n > 0 && out[n-1].hi+1 == g.lo && mergeable(&out[n-1], &g) {
			p := &out[n-1]
			p.hi = g.hi
			p.horizon = max(p.horizon, g.horizon)
			if g.seen.After(p.seen) {
				p.seen = g.seen
			}
			p.lastGen = min(p.lastGen, g.lastGen)
			continue
		}
		out = append(out, g)
	}
	clear((*s)[len(out):])
	*s = out
}

// holdBelow is the highest cursor the runs still holding allow above at.
func (s gapSet) holdBelow(at int64) int64 {
	c := int64(math.MaxInt64)
	for i := range s {
		if g := &s[i]; g.holding() && g.hi > at {
			c = min(c, max(g.lo, at+1)-1)
		}
	}
	return c
}

func mergeable(a, b *gapRun) bool {
	if !a.ended.IsZero() || !b.ended.IsZero() || a.sweeping || b.sweeping {
		return false
	}
	return a.givenUp == b.givenUp
}

// holding says whether g still holds the rows above it.
func (g *gapRun) holding() bool { return !g.givenUp && g.ended.IsZero() }

// old says whether g was given up long ago and its transactions run: it
// is looked up in turns.
func (g *gapRun) old(now time.Time, gapWait time.Duration, budget int64) bool {
	return g.givenUp && g.ended.IsZero() && !g.sweeping && (now.Sub(g.seen) >= gapWait+watchRecent || g.size() > budget)
}

// watch fills pos.Watch and pos.Holding for one read (see gapWatch for
// the bound). The turn of runs given up long ago, k, is counted from this
// read's, so the first read to find a run old looks up only its turn.
func (w *gapWatch) watch(pos *store.ReadPos, now time.Time, gapWait time.Duration) {
	w.reads++
	budget := w.watchHolding(pos)
	var old int64
	for i := range w.runs {
		if g := &w.runs[i]; g.old(now, gapWait, maxWatchPerRead) {
			old += g.size()
		}
	}
	k := max(1, (old+watchOldPerRead-1)/watchOldPerRead)
	for i := range w.runs {
		g := &w.runs[i]
		switch {
		case g.holding():
		case g.sweeping || !g.ended.IsZero():
			budget = g.watchSweep(pos, budget)
		case g.old(now, gapWait, maxWatchPerRead):
			g.watchTurn(pos, w.reads, k)
		default: // given up recently: every read, within the budget
			for id := g.lo; id <= min(g.hi, g.lo+budget-1); id++ {
				pos.Watch = append(pos.Watch, id)
			}
			budget -= min(g.size(), budget)
		}
	}
}

// watchHolding passes the runs holding first (what of them became visible
// releases the most), within maxWatchPerRead ids, and returns the budget
// left. A run longer than the budget is passed holding from its first id
// not looked up (the marker).
func (w *gapWatch) watchHolding(pos *store.ReadPos) int64 {
	budget := int64(maxWatchPerRead)
	for i := range w.runs {
		g := &w.runs[i]
		g.win, g.turned = 0, false
		if !g.holding() {
			continue
		}
		to := min(g.hi, g.lo+budget-1)
		for id := g.lo; id <= to; id++ {
			pos.Watch = append(pos.Watch, id)
			pos.Holding = append(pos.Holding, store.Gap{ID: id, Horizon: g.horizon})
		}
		budget -= max(to-g.lo+1, 0)
		if to < g.hi { // the marker: not looked up, so held
			pos.Holding = append(pos.Holding, store.Gap{ID: to + 1, Horizon: g.horizon})
		}
	}
	return budget
}

// watchSweep passes the sweep's next ids of g within budget and returns
// the budget left.
func (g *gapRun) watchSweep(pos *store.ReadPos, budget int64) int64 {
	from := min(max(g.next, g.lo), g.hi)
	to := min(g.hi, from+budget-1)
	for id := from; id <= to; id++ {
		pos.Watch = append(pos.Watch, id)
	}
	if to >= from {
		g.next, g.win = from, to
		budget -= to - from + 1
	}
	return budget
}

// watchTurn passes the ids of g, given up long ago, whose remainder mod k
// is this read's turn.
func (g *gapRun) watchTurn(pos *store.ReadPos, reads, k int64) {
	g.turned = true
	first := g.lo + ((-(g.lo+reads))%k+k)%k
	for id := first; id <= g.hi; id += k {
		pos.Watch = append(pos.Watch, id)
	}
}

// holdBack keeps watched, unsent, the rows a read found visible by turn
// (scattered ids of a run given up long ago) above their run's lowest id,
// and has the run swept from its lowest id instead: lookups by turn find a
// committed transaction's rows in no order, and sent at once each would go
// before the lower rows of its aggregate that the next reads find. The
// sweep keeps their order.
func (w *gapWatch) holdBack(res *store.ReadResult) {
	var held map[int64]bool
	res.Visible = slices.DeleteFunc(res.Visible, func(v store.Watched) bool {
		i := w.runs.find(v.ID)
		if i < 0 || !w.runs[i].turned || v.ID == w.runs[i].lo {
			return false
		}
		if g := &w.runs[i]; !g.sweeping {
			g.sweeping, g.next = true, g.lo
		}
		if held == nil {
			held = map[int64]bool{}
		}
		held[v.ID] = true
		return true
	})
	if held != nil {
		res.Rows = slices.DeleteFunc(res.Rows, func(row store.Row) bool { return held[row.ID] })
	}
}

// settle moves each run on after a read: the sweep's position,
// transactions ended, given up (gen: the sent memory's generation then),
// deleted once watched long enough. It returns the runs given up now.
func (w *gapWatch) settle(xmin uint64, now time.Time, gapWait time.Duration, gen int) (givenUp []gapRun) {
	out := w.runs[:0]
	for _, g := range w.runs {
		g.sweepDone()
		switch {
		case xmin >= g.horizon:
			// Every transaction that could own them has ended: rolled back.
			if g.ended.IsZero() {
				g.ended, g.sweeping, g.next, g.passes = now, true, g.lo, 0
			} else if now.Sub(g.ended) > lateWatch && g.passes > 0 {
				continue
			}
		case !g.givenUp && now.Sub(g.seen) >= gapWait:
			g.givenUp, g.lastGen = true, gen
			givenUp = append(givenUp, g)
		}
		out = append(out, g)
	}
	clear(w.runs[len(out):])
	w.runs = out
	return givenUp
}

// sweepDone moves g's sweep past the ids this read looked up; a pass over
// the whole run ends the sweep of a run found partly visible, or counts
// one more pass of a run whose transactions ended.
func (g *gapRun) sweepDone() {
	if g.win == 0 {
		return
	}
	if g.win >= g.next {
		g.next = g.win + 1
	}
	g.win = 0
	if g.next > g.hi {
		g.next = g.lo
		if g.ended.IsZero() {
			g.sweeping = false // one pass: a row of it was found visible
		} else {
			g.passes++
		}
	}
}
