package poller

import (
	"context"
	"fmt"

	"github.com/outboxd/outboxd/store"
)

// foundCheck finds late commits below the cursor: a row no gap of the term
// watches (its producer took the id before its transaction had an id the
// snapshot could name and wrote it after lateWatch, or was in flight when
// the term, or the holder before it, computed its cursor) that a rescan
// step or a cold pass finds. The in-term check cannot see it (no gap is
// left), nor the inherited one (it lies below the cursor loaded). Such a
// row, taken untried, is marked once a term (noteRescued) and checked once
// claimed (rescuedLate): not when Redis holds it delivered (a row an
// operator set pending again by hand looks untried in Postgres, but was
// sent in its turn).
//
// The check (store.LaterSent, one range walk from the lowest such row to
// the sent mark) runs off the lead goroutine on a view taken before the
// batch is sent (pipeline.walkLate): it sees what the lead would have seen,
// and the batch and the ones after it go meanwhile. One walk at a time; a
// batch that finds one running says which of its rows were not checked.
type foundCheck struct {
	below map[store.Aggregate]int64 // aggregates found pending below the cursor, unknown to the term: lowest id found
	taken map[int64]struct{}        // rows of theirs taken, to check once claimed
}

// noteFound records that a rescan step or a cold pass found aggregate a
// pending below the cursor from id on, where the term did not know of it.
func (l *lateCommits) noteFound(a store.Aggregate, id int64) {
	if lo, ok := l.found.below[a]; !ok || id < lo {
		if l.found.below == nil {
			l.found.below = map[store.Aggregate]int64{}
		}
		l.found.below[a] = id
	}
}

// forgetFound drops aggregate a: nothing of it is left pending below the
// cursor.
func (l *lateCommits) forgetFound(a store.Aggregate) { delete(l.found.below, a) }

// noteRescued marks, among rows taken from at or below below (the cursor
// before the read), those of an aggregate found below the cursor at or
// above its lowest id found, not tried before: rescuedLate checks them
// once claimed. Each id is marked once a term.
func (l *lateCommits) noteRescued(rows []store.Row, below int64) {
	if len(l.found.below) == 0 {
		return
	}
	for _, row := range rows {
		lo, ok := l.found.below[store.Aggregate{Type: row.AggregateType, ID: row.AggregateID}]
		if !ok || l.done(row.ID) || row.ID < lo || row.ID > below || row.Attempts != 0 {
			continue
		}
		if l.found.taken == nil {
			l.found.taken = map[int64]struct{}{}
		}
		l.markDone(row.ID)
		l.found.taken[row.ID] = struct{}{}
	}
}

// claimed returns the rows of a claimed batch that noteRescued marked,
// except those Redis holds delivered or that are poisoned, and forgets
// them.
func (l *lateCommits) claimed(items []item) []store.Row {
	if len(l.found.taken) == 0 {
		return nil
	}
	var check []store.Row
	for _, it := range items {
		if _, ok := l.found.taken[it.row.ID]; !ok {
			continue
		}
		delete(l.found.taken, it.row.ID)
		if it.outcome != duplicate && it.outcome != poisoned {
			check = append(check, it.row)
		}
	}
	return check
}

// rescuedLate starts the check of a claimed batch's rows found below the
// cursor (see foundCheck). An error names the rows left unchecked; they
// are delivered all the same.
func (p *Poller) rescuedLate(ctx context.Context, pl *pipeline, r *reader, items []item) error {
	check := r.late.claimed(items)
	if len(check) == 0 {
		return nil
	}
	return pl.walkLate(ctx, check, r.late.sent.mark())
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
				pl.p.warnLate(lateRow{row: row, after: after})
			}
		}
	})
	return nil
}
