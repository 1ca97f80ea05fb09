package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

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
// The lowest pending row is found by a walk of outbox_pending_idx in id
// order (pendingFloor), once per term that starts without a saved cursor:
// it stops at the first row, after every entry a snapshot held elsewhere
// keeps from vacuum below it, and no bound is possible without a saved
// cursor. It is not min(id) in this query: the planner may walk
// outbox_pending_aggregate_idx whole for that whenever its estimates see
// few pending rows, a buffer per row
// (TestFirstStartCostsNoMoreThanOneWalkOfThePendingIndex).
//
// sent is the highest id the earlier holders handed on (SaveCursor), at
// least cursor; with none known (no cursor saved, or saved before
// migration 00008) the table's highest id, which is at least as high.
func (s ReadPath) LoadCursor(ctx context.Context, lock string) (Cursor, error) {
	cursor, sent, horizon, epoch, err := s.loadCursor(ctx, lock)
	return Cursor{At: cursor, Sent: sent, Horizon: horizon, Epoch: epoch}, err
}

// Cursor is where a holder stands, as SaveCursor stores it and LoadCursor
// returns it.
type Cursor struct {
	// At: every id at or below is delivered, dead or backing off, except
	// what a producer in flight may still commit while Horizon is not 0.
	At int64
	// Sent is the highest id handed on to a sink, at least At.
	Sent int64
	// Horizon is the xmax of the snapshot At was computed in while the
	// cold pass is owed, 0 once it is done.
	Horizon uint64
	// Epoch is the database incarnation the cursor belongs to
	// (ReadResult.Epoch).
	Epoch string
}

func (s ReadPath) loadCursor(ctx context.Context, lock string) (cursor, sent int64, horizon uint64, epoch string, err error) {
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
func (s ReadPath) SaveCursor(ctx context.Context, f Fence, c Cursor) error {
	return s.fenced(ctx, f, saveCursorQ, []*int64{new(int64)}, pgx.NamedArgs{
		"cursor": c.At, "epoch": c.Epoch, "sent": c.Sent, "horizon": int64(c.Horizon),
	})
}

// PendingBetween returns the aggregates with pending rows not backing off
// in (lo, hi], each with its lowest such id: the poller's slow rescan below
// its cursor, for rows that re-entered the pending set there (an operator's
// UPDATE ... SET dispatched_at = NULL). Its cost is bounded by hi - lo.
func (s ReadPath) PendingBetween(ctx context.Context, lo, hi int64) ([]Parked, error) {
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
