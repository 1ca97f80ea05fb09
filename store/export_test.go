package store

import (
	"context"
	"fmt"
	"math"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// Exported for the read path's cost tests: they EXPLAIN the statements,
// prepared from their positional text (parameters numbered in the order
// their .sql header lists them).
var (
	ReadSQL        = readQ.sql
	FetchDueSQL    = fetchDueQ.sql
	CompleteSQL    = completeQ.sql
	SaveCursorSQL  = saveCursorQ.sql
	StatsSQL       = statsQ.sql
	StatsSettings  = statsSettings
	IncarnationSQL = fragment("incarnation")

	PendingRowsSQL       = pendingRowsQ.sql
	PendingByAttemptsSQL = pendingByAttemptsQ.sql
	PurgeSQL             = func(k PurgeKind) string { return purgeQuery(k).sql }
	LoadCursorSQL        = loadCursorQ.sql
	PendingFloorSQL      = pendingFloorQ.sql
	LoadFloorSQL         = loadFloorQ.sql
	FloorSettings        = floorSettings
	EpochSQL             = `SELECT ` + fragment("epoch")
)

// ReadArgs are read.sql's positional arguments for lim and pos, and the
// per-row limit.
func ReadArgs(lim FetchLimits, pos ReadPos) ([]any, int64) {
	na, rowBytes := readArgs(lim, pos)
	args, err := readQ.args(na)
	if err != nil {
		panic(err)
	}
	return args, rowBytes
}

// DeadListSQL is the list's positional statement and arguments.
func DeadListSQL(f DeadFilter, after *DeadCursor, limit int) (string, []any) {
	q, na := deadList(f, after, limit)
	args, err := q.args(na)
	if err != nil {
		panic(err)
	}
	return q.sql, args
}

// Querier is what the store's statements run on: the pool, or behind a
// transaction pooler the pool with the settings set in each transaction.
func (s *Store) Querier() interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
} {
	return s.db
}

// PendingRows is the repair sweep's PendingRowsFrom with the floor
// SweepFloor returns.
func (s Reconcile) PendingRows(ctx context.Context, cursor int64, limit int) ([]Pending, error) {
	floor, err := s.SweepFloor(ctx)
	if err != nil {
		return nil, err
	}
	return s.PendingRowsFrom(ctx, PendingPage{Floor: floor, After: cursor, Limit: limit})
}

// fetchDueQ is fetch_due.sql: due rows from id 0, the stateless form
// tests compare Read with.
var fetchDueQ = stmt("fetch_due")

// FetchDue reads due rows in id order within lim (fetch_due.sql).
func (s ReadPath) FetchDue(ctx context.Context, lim FetchLimits) ([]Row, error) {
	rowBytes, budget := lim.RowBytes, lim.Bytes
	if rowBytes <= 0 || rowBytes > maxRowBytes {
		rowBytes = maxRowBytes
	}
	if budget <= 0 {
		budget = math.MaxInt64
	}
	bt, ba := make([]string, len(lim.Busy)), make([]string, len(lim.Busy))
	for i, b := range lim.Busy {
		bt[i], ba[i] = b.Type, b.ID
	}
	res, err := fetchDueQ.query(ctx, s.db, pgx.NamedArgs{"rows": lim.Rows, "row_bytes": rowBytes, "bytes": budget,
		"skip": lim.Skip, "busy_types": bt, "busy_ids": ba})
	if err != nil {
		return nil, wrap("fetch due", err)
	}
	return pgx.CollectRows(res, func(r pgx.CollectableRow) (Row, error) {
		var x Row
		var created pgtype.Timestamptz
		err := r.Scan(&x.ID, &x.AggregateType, &x.AggregateID, &x.EventType, (*[]byte)(&x.Payload), (*[]byte)(&x.Headers),
			&created, &x.Attempts, &x.Size)
		switch {
		case err != nil:
		case x.Size > rowBytes:
			x.Poison = fmt.Sprintf("row is %d bytes, above poller.max_payload_bytes (%d): not loaded, not sent", x.Size, rowBytes)
		case created.InfinityModifier != pgtype.Finite:
			x.Poison = "created_at is infinite: the event cannot be timestamped"
		}
		x.CreatedAt = created.Time
		return x, err
	})
}
