package poller

import "github.com/outboxd/outboxd/store"

// foundCheck finds late commits below the cursor: a row no gap of the term
// watches that a rescan step or a cold pass finds. Its producer took the id
// before its transaction had an id the snapshot could name and wrote it
// after lateWatch, or was in flight when the term, or the holder before it,
// computed its cursor. The in-term check cannot see it (no gap is left),
// nor the inherited one (it lies below the cursor loaded). Such a row,
// taken untried, is marked once a term (rescued) and checked once claimed
// (claimed). A row Redis holds delivered is not checked: an operator set it
// pending again by hand, and it was sent in its turn.
//
// The check (store.ReadPath.LaterSent, one range walk from the lowest such row to
// the sent mark) runs off the lead goroutine on a view taken before the
// batch is sent (pipeline.walkLate). It sees what the lead would have seen,
// and the batch and the ones after it go meanwhile. One walk runs at a time;
// a batch that finds one running says which of its rows were not checked.
type foundCheck struct {
	below map[store.Aggregate]int64 // aggregates found pending below the cursor, unknown to the term: lowest id found
	taken map[int64]struct{}        // rows of theirs taken, to check once claimed
}

// note records that a rescan step or a cold pass found aggregate a pending
// below the cursor from id on, where the term did not know of it.
func (c *foundCheck) note(a store.Aggregate, id int64) {
	if lo, ok := c.below[a]; !ok || id < lo {
		if c.below == nil {
			c.below = map[store.Aggregate]int64{}
		}
		c.below[a] = id
	}
}

// forget drops aggregate a: nothing of it is left pending below the cursor.
func (c *foundCheck) forget(a store.Aggregate) { delete(c.below, a) }

// rescued marks, among rows taken from at or below below (the cursor
// before the read), those of an aggregate found below the cursor at or
// above its lowest id found, not tried before: claimed returns them. Each
// id is marked once a term (checked).
func (c *foundCheck) rescued(rows []store.Row, below int64, checked *checkedSet) {
	if len(c.below) == 0 {
		return
	}
	for _, row := range rows {
		lo, ok := c.below[store.Aggregate{Type: row.AggregateType, ID: row.AggregateID}]
		if !ok || checked.done(row.ID) || row.ID < lo || row.ID > below || row.Attempts != 0 {
			continue
		}
		if c.taken == nil {
			c.taken = map[int64]struct{}{}
		}
		checked.mark(row.ID)
		c.taken[row.ID] = struct{}{}
	}
}

// claimed returns the rows of a claimed batch that rescued marked, except
// those Redis holds delivered or that are poisoned, and forgets them.
func (c *foundCheck) claimed(items []item) []store.Row {
	if len(c.taken) == 0 {
		return nil
	}
	var check []store.Row
	for _, it := range items {
		if _, ok := c.taken[it.row.ID]; !ok {
			continue
		}
		delete(c.taken, it.row.ID)
		if it.outcome != duplicate && it.outcome != poisoned {
			check = append(check, it.row)
		}
	}
	return check
}
