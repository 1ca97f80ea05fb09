package poller

import (
	"slices"
	"time"

	"github.com/outboxd/outboxd/store"
)

// Watched gaps are kept as runs of consecutive ids that share one state,
// so that what a term keeps, and what each read does, depends on the
// number of runs, not of ids. One producer transaction that inserts N rows
// and stays open while others commit leaves N consecutive gaps: as single
// ids (a map entry and a gapState each) 1M of them cost ~120 MB of heap and
// every read walked them all (pos, advance, saveable), looked up every one
// not yet given up by primary key, and, once their transaction ended, every
// one again by every read for lateWatch: 187 ms of CPU a read behind 1M
// (BENCHMARKS.md, "Session 7, bounds"; TestBulkTransactionGapsAreBounded).
//
// Bound: a read looks up at most maxWatchPerRead ids of the runs holding,
// given up recently or swept (below), and about watchOldPerRead of the
// runs given up long ago (in turns, as before); the other ids of a run
// holding stay holding unlooked at (a marker: the first id not looked up,
// counted as not visible, so the hold is never lower than the truth).
//
// A run is swept, maxWatchPerRead ids a read from its lowest, when its
// transactions ended (pass after pass until lateWatch passed and one pass
// was done: every id is looked up at least once after its transactions
// ended, and a small run by every read for lateWatch, as before), and for
// one pass when one of its ids was found visible (its transaction
// committed: the rest of its rows most likely with it, and found at
// maxWatchPerRead a read rather than watchOldPerRead).
//
// Not bounded: gaps that are not consecutive (a batch job that inserts one
// row per statement while other producers commit between them) are a run
// each, as before a gap each: the memory is a run (~80 bytes) per gap and
// each read walks the runs in memory (no more lookups than the bound).

// maxWatchPerRead bounds the ids of runs holding, recently given up or
// swept that one read looks up (primary-key probes); old runs add about
// watchOldPerRead. 4,096 probes are about a fetch of a full batch's work.
const maxWatchPerRead = 4096

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

// watch fills pos.Watch and pos.Holding from r.gaps for one read (see the
// type's comment for the bound). The turn of runs given up long ago, k, is
// counted from this read's: counted from the last read's, the first read
// to find a run old (or a run grown old at once) looked it up whole.
func (r *reader) watch(pos *store.ReadPos, now time.Time, gapWait time.Duration) {
	budget := int64(maxWatchPerRead)
	var old int64
	for i := range r.gaps {
		if g := &r.gaps[i]; g.old(now, gapWait, budget) {
			old += g.size()
		}
	}
	k := max(1, (old+watchOldPerRead-1)/watchOldPerRead)
	// Runs holding first: they hold the rows above them, so what of them
	// became visible is what releases the most.
	for i := range r.gaps {
		g := &r.gaps[i]
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
	for i := range r.gaps {
		g := &r.gaps[i]
		switch {
		case g.holding():
		case g.sweeping || !g.ended.IsZero():
			from := min(max(g.next, g.lo), g.hi)
			to := min(g.hi, from+budget-1)
			for id := from; id <= to; id++ {
				pos.Watch = append(pos.Watch, id)
			}
			if to >= from {
				g.next, g.win = from, to
				budget -= to - from + 1
			}
		case g.old(now, gapWait, maxWatchPerRead):
			// Given up long ago, transactions running: in turns, the
			// ids whose remainder mod k is this read's.
			g.turned = true
			first := g.lo + ((-(g.lo+r.reads))%k+k)%k
			for id := first; id <= g.hi; id += k {
				pos.Watch = append(pos.Watch, id)
			}
		default: // given up recently: every read, within the budget
			for id := g.lo; id <= min(g.hi, g.lo+budget-1); id++ {
				pos.Watch = append(pos.Watch, id)
			}
			budget -= min(g.size(), budget)
		}
	}
}

// holdBack keeps in r.gaps, unsent, the rows a read found visible by turn
// (scattered ids of a run given up long ago) above their run's lowest id,
// and has the run swept from its lowest id instead. The lookups by turn
// find a committed transaction's rows in no order: sent at once, each one
// went before the lower rows of its aggregate that the next reads found,
// and all those were late commits (18,253 WARNs for a 30,000-row bulk over
// 50 aggregates that committed after gap_wait, where the sweep from the
// lowest id, as every read's lookup of all gaps before, keeps their order
// and warns for the one row that is late).
func (r *reader) holdBack(res *store.ReadResult) {
	var held map[int64]bool
	res.Visible = slices.DeleteFunc(res.Visible, func(w store.Watched) bool {
		i := r.gaps.find(w.ID)
		if i < 0 || !r.gaps[i].turned || w.ID == r.gaps[i].lo {
			return false
		}
		if g := &r.gaps[i]; !g.sweeping {
			g.sweeping, g.next = true, g.lo
		}
		if held == nil {
			held = map[int64]bool{}
		}
		held[w.ID] = true
		return true
	})
	if held != nil {
		res.Rows = slices.DeleteFunc(res.Rows, func(row store.Row) bool { return held[row.ID] })
	}
}

// settle moves each run on after a read (advance): the sweep's position,
// transactions ended, given up, deleted once watched long enough.
func (p *Poller) settle(r *reader, xmin uint64, now time.Time) {
	out := r.gaps[:0]
	for _, g := range r.gaps {
		if g.win != 0 {
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
		switch {
		case xmin >= g.horizon:
			// Every transaction that could own them has ended: rolled back.
			if g.ended.IsZero() {
				g.ended, g.sweeping, g.next, g.passes = now, true, g.lo, 0
			} else if now.Sub(g.ended) > lateWatch && g.passes > 0 {
				continue
			}
		case !g.givenUp && now.Sub(g.seen) >= p.cfg.GapWait:
			g.givenUp, g.lastGen = true, r.gen
			p.m.GapsGivenUp.Add(float64(g.size()))
			p.log.Debug("gap given up", "outbox_id", g.lo, "to_id", g.hi, "waited_ms", now.Sub(g.seen).Milliseconds())
		}
		out = append(out, g)
	}
	clear(r.gaps[len(out):])
	r.gaps = out
}
