package store

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// Exported for the read path's cost test: it EXPLAINs the statements.
var (
	ReadSQL        = readSQL
	FetchDueSQL    = fetchDueSQL
	ReadArgs       = readArgs
	CompleteSQL    = completeSQL
	SaveCursorSQL  = saveCursorSQL
	StatsSQL       = statsSQL
	StatsSettings  = statsSettings
	IncarnationSQL = incarnationSQL

	PendingRowsSQL       = pendingRowsSQL
	PendingByAttemptsSQL = pendingByAttemptsSQL
	PurgeSQL             = purgeSQL
	LoadCursorSQL        = loadCursorSQL
	PendingFloorSQL      = pendingFloorSQL
	LoadFloorSQL         = loadFloorSQL
	FloorSettings        = floorSettings
	EpochSQL             = `SELECT ` + epochSQL
)

// Querier is what the store's statements run on: the pool, or behind a
// transaction pooler the pool with the settings set in each transaction.
func (s *Store) Querier() interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
} {
	return s.db
}
