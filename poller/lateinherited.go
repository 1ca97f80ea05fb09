package poller

import (
	"context"
	"fmt"
	"slices"

	"github.com/outboxd/outboxd/store"
)

// maxInherit bounds the late rows and the missing ids a term keeps for
// its inherited late-commit check (store.ReadPath.InheritedLate).
const maxInherit = 100_000

// inheritedCheck finds late commits across a change of holder: each holder
// saves, beside its cursor, the highest id it and the holders before it
// handed on (the sent mark, sentMemory.handedMark once loaded). A new holder
// checks each row it takes in (lo, sent mark] once, where lo is the cursor
// it loaded, for a later row of its aggregate already dispatched.
//
// Its cost is one store.ReadPath.InheritedLate a term (one walk of the range,
// whatever the number of aggregates): it says which rows visible then are
// late and which ids were missing. A row is then settled in memory, and
// only a row at an id missing then (its producer was in flight) goes to
// store.ReadPath.LaterSent. Reads that take no row in the range cost nothing.
// Rows the last holder never sent (it stopped first), and rows tried
// before (retries, replayed dead rows), are not warned.
type inheritedCheck struct {
	lo int64 // the cursor the term loaded
	// in is what the range looked like when the term first took a row
	// there: the late rows and the ids missing then; nil while not loaded
	// or when either is more than the limit (then each read's rows
	// go to store.ReadPath.LaterSent).
	in     *store.Inherited
	loaded bool
}

// from starts the check at the cursor the term loaded.
func (c *inheritedCheck) from(cursor int64) { c.lo = cursor }

// late returns the rows among rows (taken by one read) in (lo, hi] that are
// late commits across the change of holder, each checked once a term
// (checked). hi is the sent mark handed on. The rows found before an error
// are returned with it.
func (c *inheritedCheck) late(ctx context.Context, st store.ReadPath, limit int, rows []store.Row, hi int64, checked *checkedSet) ([]lateRow, error) {
	unchecked := func(row store.Row) bool {
		return !checked.done(row.ID) && row.ID > c.lo && row.ID <= hi
	}
	first := slices.IndexFunc(rows, unchecked)
	if first < 0 {
		return nil, nil
	}
	if !c.loaded {
		in, err := st.InheritedLate(ctx, store.InheritedRange{Lo: c.lo, Hi: hi, Limit: limit})
		if err != nil {
			return nil, fmt.Errorf("late commit check: %w", err)
		}
		c.loaded = true
		c.in = in // nil when too many: LaterSent checks each row
	}
	var late []lateRow
	var check []store.Row // only the rows the query must settle are copied
	for _, row := range rows[first:] {
		if !unchecked(row) {
			continue
		}
		switch after, known := c.settledAtLoad(row.ID); {
		case !known:
			check = append(check, row)
		case after != 0:
			checked.mark(row.ID)
			late = append(late, lateRow{row: row, after: after})
		}
	}
	if len(check) == 0 {
		return late, nil
	}
	later, err := st.LaterSent(ctx, check, hi)
	if err != nil {
		return late, fmt.Errorf("late commit check: %w", err)
	}
	for _, row := range check {
		checked.mark(row.ID)
		if after, ok := later[row.ID]; ok {
			late = append(late, lateRow{row: row, after: after})
		}
	}
	return late, nil
}

// settledAtLoad answers for a row at id from the term's check of the
// range: known when the row was visible then (late when after is not 0),
// not known when its producer was in flight then (or the check holds too
// much): store.ReadPath.LaterSent answers for it.
func (c *inheritedCheck) settledAtLoad(id int64) (after int64, known bool) {
	in := c.in
	if in == nil {
		return 0, false
	}
	if after, ok := in.Late[id]; ok {
		return after, true
	}
	return 0, !in.InHole(id)
}
