package store

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jackc/pgx/v5/pgtype"
)

// Aggregate names one ordering key.
type Aggregate struct{ Type, ID string }

// The statements of cursor.sql.
var (
	loadCursorQ     = stmt("load_cursor")
	saveCursorQ     = stmt("save_cursor")
	laterSentQ      = stmt("later_sent")
	inheritedLateQ  = stmt("inherited_late")
	pendingBetweenQ = stmt("pending_between")
	viewSnapshotQ   = stmt("view_snapshot")
)

// LoadCursor returns where a new holder's reads start: the cursor the last
// holder of lock saved (SaveCursor) in this epoch (ReadResult.Epoch), with
// the horizon saved beside it (0 unless that holder still owed its cold
// pass: a successor owes it in its place): one query. With none saved (a
// first start, or the first start after upgrading onto a table with
// history) it starts just below the lowest pending row, and at most a span
// (10,000 ids) below the highest id, so the first reads neither walk the
// settled history a span at a time (this one query walks it once per term
// instead) nor pass the ids producers in flight most likely hold: those
// are seen as gaps as usual. Such a cursor is not yet settled: an older id
// below it may belong to a producer transaction in progress when it was
// computed, so it comes with horizon, that snapshot's xmax; until a
// snapshot's xmin reaches it the caller keeps rescanning below the cursor.
//
// The lowest pending row is found by a bitmap scan of a pending index
// (pendingFloor), once per term that starts without a saved cursor: it
// reads every entry a snapshot held elsewhere keeps from vacuum, and no
// bound is possible without a saved cursor. It is not min(id) in this
// query: the planner may walk outbox_pending_aggregate_idx whole for that
// whenever its estimates see few pending rows, a buffer per row
// (TestFirstStartCostsNoMoreThanABitmapOfThePendingIndex).
//
// sent is the highest id the earlier holders handed on (SaveCursor), at
// least cursor; with none known (no cursor saved, or saved before
// migration 00008) the table's highest id, which is at least as high.
func (s *Store) LoadCursor(ctx context.Context, lock string) (cursor, sent int64, horizon uint64, epoch string, err error) {
	var h int64
	var floor pgtype.Int8 // NULL: nothing pending
	for walked := false; ; walked = true {
		err = loadCursorQ.queryRow(ctx, s.db, pgx.NamedArgs{"lock": lock, "span": int64(defaultSpan), "floor": floor}).
			Scan(&cursor, &sent, &h, &epoch)
		if err != nil {
			return 0, 0, 0, "", wrap("load cursor", err)
		}
		if h == 0 || walked {
			return cursor, max(sent, cursor), uint64(max(h, 0)), epoch, nil
		}
		// None saved: find the lowest pending row (pendingFloor), then
		// load again, so that the horizon is of a snapshot taken after
		// that walk's.
		if floor, err = s.pendingFloor(ctx, loadFloorQ); err != nil {
			return 0, 0, 0, "", err
		}
	}
}

// SaveCursor stores where f's holder stands, fenced: every id at or below
// cursor is delivered, dead or backing off, except that, while horizon is
// not 0, a producer in flight when the cursor was computed may still commit
// a row below it (the cold pass the holder owes, which LoadCursor hands to
// its successor); and no id above sent was handed on to a sink by this
// holder or the ones before it. A stale holder changes nothing
// (ErrStaleFence).
func (s *Store) SaveCursor(ctx context.Context, f Fence, cursor, sent int64, horizon uint64, epoch string) error {
	return s.fenced(ctx, f, saveCursorQ, []*int64{new(int64)}, pgx.NamedArgs{
		"cursor": cursor, "epoch": epoch, "sent": sent, "horizon": int64(horizon),
	})
}

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
func (s *Store) LaterSent(ctx context.Context, rows []Row, sent int64) (map[int64]int64, error) {
	return laterSent(ctx, s.db, rows, sent)
}

// View is one read-only, repeatable-read view of the outbox: what was
// committed when View returned it, however long its user waits before
// asking. It holds a pooled connection until Close. Read-only, it holds no
// transaction id, so nothing waiting for the server-wide xmin (a cold pass)
// waits for it.
type View struct{ tx pgx.Tx }

// View takes a view of the outbox now (one round trip).
func (s *Store) View(ctx context.Context) (*View, error) {
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

// LaterSent is Store.LaterSent as of the view.
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
// in (lo, hi] for late commits across the change of holder, in one
// statement: its cost is one walk of (lo, hi] (a hash of the aggregates
// dispatched there; below the highest of them, the pending rows of those
// aggregates and the ids missing: nothing more when none is dispatched),
// once a term, whatever the number of aggregates; the memory it returns is the
// late rows and the holes, not the aggregates. complete is false (and the
// answer nil) when either is more than limit.
//
// Not flat: the generic plan made on a small table finds the late rows
// through outbox_pending_aggregate_idx, whose pages hold every entry a
// snapshot held elsewhere keeps of the delivered history (once a term).
// It is not written in the opaque COALESCE form that keeps the other
// statements off that index: that form's generic plan is a nested loop
// over the range per dispatched aggregate.
// TestHotPathPlansMadeOnASmallTableStayFlat bounds it as a once-a-term
// statement.
func (s *Store) InheritedLate(ctx context.Context, lo, hi int64, limit int) (in *Inherited, complete bool, err error) {
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

// PendingBetween returns the aggregates with pending rows not backing off
// in (lo, hi], each with its lowest such id: the poller's slow rescan below
// its cursor, for rows that re-entered the pending set there (an operator's
// UPDATE ... SET dispatched_at = NULL). Its cost is bounded by hi - lo.
func (s *Store) PendingBetween(ctx context.Context, lo, hi int64) ([]Parked, error) {
	rows, err := pendingBetweenQ.query(ctx, s.db, pgx.NamedArgs{"lo": lo, "hi": hi})
	if err != nil {
		return nil, wrap("rescan", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Parked, error) {
		var p Parked
		err := r.Scan(&p.Type, &p.ID, &p.MinID)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: rescan: %w", err)
	}
	return out, nil
}
