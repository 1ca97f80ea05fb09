package poller

import (
	"context"

	"github.com/outboxd/outboxd/store"
)

// lateCommits finds late commits: rows that commit after a later row of
// their aggregate was sent. A late commit is delivered all the same. It is
// never silent: each is warned ("late commit") and counted in
// outboxd_late_commits_total, once per row a term. Three checks find them,
// each where the others cannot look. All ask one memory of what was sent
// (sentMemory):
//
//   - in the term (gapCommitted): a watched gap, given up after gap_wait,
//     found visible;
//   - across a change of holder (inheritedCheck, lateinherited.go): a row
//     taken above the cursor the term loaded and at or below the sent mark
//     the holders before it handed on;
//   - below the cursor (foundCheck, latefound.go): a row a rescan step or
//     a cold pass found where no gap of the term watches.
//
// lateCommits is the one type the read path asks; the checks do not call
// each other. The reader uses it from the lead goroutine only. The walk of
// rows found below the cursor runs off it on a copy (pipeline.walkLate).
//
// Not warned: a row whose later sibling was sent above the saved sent mark
// by a holder that lost the lease before saving it (at most saveEvery of
// sends). Not warned either: a row found below the cursor whose later
// sibling was taken and not yet written when it was checked. What an
// operator sees: docs/design.md, "Order when producers race".
type lateCommits struct {
	sent      sentMemory
	checked   checkedSet // ids checked or warned this term
	inherited inheritedCheck
	found     foundCheck
}

// newLateCommits returns a term's late-commit checks; limit bounds the
// per-aggregate sent memory (0: maxLastSent).
func newLateCommits(limit int) lateCommits {
	return lateCommits{sent: sentMemory{last: map[store.Aggregate]int64{}, limit: limit}, checked: checkedSet{}}
}

// loaded starts the checks from the cursor the term loaded and the sent
// mark the holders before it handed on.
func (l *lateCommits) loaded(cursor, sentMark int64) {
	l.inherited.from(cursor)
	l.sent.handedOn(sentMark)
}

// noteSent records that id of aggregate a is sent (or on its way).
func (l *lateCommits) noteSent(a store.Aggregate, id int64) { l.sent.note(a, id) }

// mark is the sent mark a successor needs (sentMemory.mark).
func (l *lateCommits) mark() int64 { return l.sent.mark() }

// generation is the sent memory's generation, kept by a gap given up.
func (l *lateCommits) generation() int { return l.sent.generation() }

// gapCommitted judges a gap given up after gap_wait that became visible
// pending. It is late when the sent memory holds a later row of its
// aggregate (after: that row). It is late too when the memory forgot its
// aggregate since the gap was given up (after: the highest id sent).
func (l *lateCommits) gapCommitted(g gapState, id int64, a store.Aggregate) (after int64, late bool) {
	after, late = l.sent.laterSent(a, id, g.lastGen)
	if late {
		l.checked.mark(id) // warned once, not again by the other checks
	}
	return after, late
}

// checkTaken returns the rows among rows (taken by one read) that are late
// commits across the change of holder (inheritedCheck). It marks those taken
// from below the cursor (at or below below) for the check once claimed
// (foundCheck). The rows found before an error are returned with it.
func (l *lateCommits) checkTaken(ctx context.Context, st store.ReadPath, limit int, rows []store.Row, below int64) ([]lateRow, error) {
	late, err := l.inherited.late(ctx, st, limit, rows, l.sent.handedMark(), &l.checked)
	l.found.rescued(rows, below, &l.checked)
	return late, err
}

// noteFound records that a rescan step or a cold pass found aggregate a
// pending below the cursor from id on, where the term did not know of it.
func (l *lateCommits) noteFound(a store.Aggregate, id int64) { l.found.note(a, id) }

// forgetFound drops aggregate a: nothing of it is left pending below the
// cursor.
func (l *lateCommits) forgetFound(a store.Aggregate) { l.found.forget(a) }

// claimed returns the rows of a claimed batch to check off the lead
// (foundCheck.claimed).
func (l *lateCommits) claimed(items []item) []store.Row { return l.found.claimed(items) }
