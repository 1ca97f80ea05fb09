package store

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// Late commits: rows that commit below ids an earlier holder already
// handed on. The statements are in cursor.sql.

// LaterSent returns, for each of rows (pending rows a new holder read at
// or below the sent mark its predecessors saved, LoadCursor), the highest
// id of its aggregate in (row, sent] that is already dispatched: the row
// committed after a later row of its aggregate was handed on by an earlier
// holder (a late commit). Rows with none are absent, and so are rows
// attempted or due later than written (a retry, a replayed dead row): a
// late commit is a row no holder has tried yet. One primary-key range
// walk over (lowest row id, sent]: no index covers dispatched rows by
// aggregate, and the range is the earlier holders' last few reads.
//
// The walk is one per call, whatever the plan: the dispatched rows'
// highest id per aggregate is taken over the range once and paired with
// the rows in Go, not joined in SQL (each row's own range (row, sent]),
// which a plan made after ANALYZE saw the history may scan once per row
// (TestHotPathPlansMadeOnASmallTableStayFlat).
//
// Rows at or above sent have no such id and are not looked up: the query
// for them alone may be planned as a walk of the aggregates' whole
// history.
func (s ReadPath) LaterSent(ctx context.Context, rows []Row, sent int64) (map[int64]int64, error) {
	return laterSent(ctx, s.db, rows, sent)
}

// View is one read-only, repeatable-read view of the outbox: what was
// committed when View returned it, however long its user waits before
// asking. It holds a pooled connection until Close. Read-only, it holds no
// transaction id, so nothing waiting for the server-wide xmin (a cold pass)
// waits for it.
type View struct{ tx pgx.Tx }

// View takes a view of the outbox now (one round trip).
func (s ReadPath) View(ctx context.Context) (*View, error) {
	tx, err := s.db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, wrap("view", err)
	}
	// A repeatable-read transaction's snapshot is taken by its first
	// statement, not by BEGIN.
	if _, err := tx.Exec(ctx, viewSnapshotQ.sql); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, wrap("view", err)
	}
	return &View{tx: tx}, nil
}

// LaterSent is ReadPath.LaterSent as of the view.
func (v *View) LaterSent(ctx context.Context, rows []Row, sent int64) (map[int64]int64, error) {
	return laterSent(ctx, v.tx, rows, sent)
}

// Close ends the view and gives its connection back.
func (v *View) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = v.tx.Rollback(ctx)
}

func laterSent(ctx context.Context, db queryer, rows []Row, sent int64) (map[int64]int64, error) {
	rows = slices.DeleteFunc(slices.Clone(rows), func(r Row) bool { return r.ID >= sent })
	if len(rows) == 0 {
		return nil, nil
	}
	ids, types, aggs := make([]int64, len(rows)), make([]string, len(rows)), make([]string, len(rows))
	lo := rows[0].ID
	for i, r := range rows {
		ids[i], types[i], aggs[i] = r.ID, r.AggregateType, r.AggregateID
		lo = min(lo, r.ID)
	}
	q, err := laterSentQ.query(ctx, db, pgx.NamedArgs{"ids": ids, "types": types, "aggs": aggs, "lo": lo, "sent": sent})
	if err != nil {
		return nil, wrap("later sent", err)
	}
	// The pairing is done here, in maps: in SQL, each plan Postgres made
	// for it after an ANALYZE (a range scan per row, a nested loop over
	// the two lists) did work per pair of rows.
	type key struct{ t, a string }
	var kind, t, a string
	var id int64
	asked, last := map[int64]key{}, map[key]int64{}
	if _, err := pgx.ForEachRow(q, []any{&kind, &id, &t, &a}, func() error {
		if kind == "c" {
			asked[id] = key{t, a}
		} else {
			last[key{t, a}] = id
		}
		return nil
	}); err != nil {
		return nil, wrap("later sent", err)
	}
	out := map[int64]int64{}
	for id, k := range asked {
		if m, ok := last[k]; ok && m > id {
			out[id] = m
		}
	}
	return out, nil
}

// Inherited is what a new holder knows, from one snapshot, of the rows in
// (lo, hi] (its loaded cursor, the sent mark): Late, the untried pending
// rows with a later row of their aggregate in (row, hi] already dispatched
// (row id -> the highest such id): each a late commit when taken; and
// Holes, the ids with no row visible then, as open intervals in id order,
// below the highest dispatched id of the range (an id above it can have no
// later dispatched row). A row taken later at an id in no hole was visible
// then or is above that, so Late settled it; only a row at a hole's id (a
// producer in flight at the snapshot) needs LaterSent.
type Inherited struct {
	Late  map[int64]int64
	Holes []Hole
}

// Hole is the ids strictly between After and Before.
type Hole struct{ After, Before int64 }

// InHole says whether id lies in one of h's holes (sorted, disjoint).
func (h *Inherited) InHole(id int64) bool {
	i, _ := slices.BinarySearchFunc(h.Holes, id, func(x Hole, id int64) int { return cmp.Compare(x.Before, id+1) })
	return i < len(h.Holes) && h.Holes[i].After < id
}

// InheritedLate reads what a new holder needs to check the rows it takes
// in (r.Lo, r.Hi] for late commits across the change of holder, in one
// statement: its cost is one walk of (lo, hi] (a hash of the aggregates
// dispatched there; below the highest of them, the pending rows of those
// aggregates and the ids missing: nothing more when none is dispatched),
// once a term, whatever the number of aggregates; the memory it returns is the
// late rows and the holes, not the aggregates. It returns nil when either
// is more than r.Limit.
//
// Not flat: the generic plan made on a small table finds the late rows
// through outbox_pending_aggregate_idx, whose pages hold every entry a
// snapshot held elsewhere keeps of the delivered history (once a term).
// It is not written in the opaque COALESCE form that keeps the other
// statements off that index: that form's generic plan is a nested loop
// over the range per dispatched aggregate.
// TestHotPathPlansMadeOnASmallTableStayFlat bounds it as a once-a-term
// statement.
func (s ReadPath) InheritedLate(ctx context.Context, r InheritedRange) (*Inherited, error) {
	in, _, err := s.inheritedLate(ctx, r.Lo, r.Hi, r.Limit)
	return in, err
}

// InheritedRange asks InheritedLate about the ids in (Lo, Hi], for at most
// Limit late rows and Limit holes.
type InheritedRange struct {
	Lo, Hi int64
	Limit  int
}

func (s ReadPath) inheritedLate(ctx context.Context, lo, hi int64, limit int) (in *Inherited, complete bool, err error) {
	rows, err := inheritedLateQ.query(ctx, s.db, pgx.NamedArgs{"lo": lo, "hi": hi, "limit": limit + 1})
	if err != nil {
		return nil, false, wrap("inherited late", err)
	}
	in = &Inherited{Late: map[int64]int64{}}
	var hole bool
	var x, y int64
	if _, err := pgx.ForEachRow(rows, []any{&hole, &x, &y}, func() error {
		if hole {
			in.Holes = append(in.Holes, Hole{After: x, Before: y})
		} else {
			in.Late[x] = y
		}
		return nil
	}); err != nil {
		return nil, false, wrap("inherited late", err)
	}
	if len(in.Late) > limit || len(in.Holes) > limit+1 {
		return nil, false, nil
	}
	slices.SortFunc(in.Holes, func(a, b Hole) int { return cmp.Compare(a.After, b.After) })
	return in, true, nil
}
