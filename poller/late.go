package poller

import (
	"time"

	"github.com/outboxd/outboxd/store"
)

// lateCommits finds late commits: rows that commit after a later row of
// their aggregate was sent. A late commit is delivered all the same; it is
// never silent: each is warned ("late commit") and counted in
// outboxd_late_commits_total, once per row a term. Three checks find them,
// each where the others cannot look, and all ask one memory of what was
// sent (sentMemory):
//
//   - in the term (gapCommitted): a watched gap, given up after gap_wait,
//     found visible;
//   - across a change of holder (inheritedLate, lateinherited.go): a row
//     taken above the cursor the term loaded and at or below the sent mark
//     the holders before it handed on;
//   - below the cursor (noteFound, noteRescued, rescuedLate, latefound.go):
//     a row a rescan step or a cold pass found where no gap of the term
//     watches.
//
// The reader uses it from the lead goroutine only; the walk of rows found
// below the cursor runs off it on a copy (pipeline.walkLate).
//
// Not warned: a row whose later sibling was sent above the saved sent mark
// by a holder that lost the lease before saving it (at most saveEvery of
// sends); for a row found below the cursor, one whose later sibling was
// taken and not yet written when it was checked. What an operator sees:
// docs/design.md, "Order when producers race".
type lateCommits struct {
	sent      sentMemory
	warned    map[int64]struct{} // ids checked or warned this term
	inherited inheritedCheck
	found     foundCheck
}

// lateRow is a late commit: row, after a later row of its aggregate (after)
// was dispatched.
type lateRow struct {
	row   store.Row
	after int64
}

// done says whether id was checked or warned this term.
func (l *lateCommits) done(id int64) bool {
	_, ok := l.warned[id]
	return ok
}

// markDone records id as checked or warned this term.
func (l *lateCommits) markDone(id int64) {
	if l.warned == nil {
		l.warned = map[int64]struct{}{}
	}
	l.warned[id] = struct{}{}
}

// gapCommitted judges a gap given up after gap_wait that became visible
// pending: late (after: the later row of its aggregate sent first) when
// the sent memory holds a later row of its aggregate, or forgot its
// aggregate since the gap was given up (after: the highest id sent).
func (l *lateCommits) gapCommitted(g gapState, id int64, a store.Aggregate) (after int64, late bool) {
	after, known := l.sent.last[a]
	switch {
	case !known && g.lastGen == l.sent.gen:
		return 0, false // nothing of its aggregate sent since it was given up
	case known && after < id:
		return 0, false
	case !known:
		after = l.sent.top
	}
	l.markDone(id) // warned once, not again by the other checks
	return after, true
}

// gapCommitted reports a gap that committed after it was given up: a WARN
// and the count when it is late, an INFO when its order held.
func (p *Poller) gapCommitted(r *reader, g gapState, id int64, a store.Aggregate, now time.Time) {
	waited := now.Sub(g.seen).Milliseconds()
	after, late := r.late.gapCommitted(g, id, a)
	if !late {
		p.log.Info("gap committed after poller.gap_wait, order kept", "outbox_id", id, "waited_ms", waited)
		return
	}
	p.m.LateCommits.Inc()
	p.log.Warn("late commit", "aggregate_type", a.Type, "aggregate_id", a.ID, "outbox_id", id, "after_id", after,
		"waited_ms", waited)
}

// warnLate warns for and counts a late row found by the inherited or the
// below-the-cursor check.
func (p *Poller) warnLate(l lateRow) {
	p.m.LateCommits.Inc()
	p.log.Warn("late commit", "aggregate_type", l.row.AggregateType, "aggregate_id", l.row.AggregateID,
		"outbox_id", l.row.ID, "after_id", l.after, "waited_ms", time.Since(l.row.CreatedAt).Milliseconds())
}
