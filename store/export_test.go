package store

import "context"

// Exported for the read path's cost test: it EXPLAINs the statements.
var (
	ReadSQL        = readSQL
	FetchDueSQL    = fetchDueSQL
	ReadArgs       = readArgs
	CompleteSQL    = completeSQL
	SaveCursorSQL  = saveCursorSQL
	StatsSQL       = statsSQL
	IncarnationSQL = incarnationSQL

	PendingRowsSQL       = pendingRowsSQL
	PendingByAttemptsSQL = pendingByAttemptsSQL
	PurgeSQL             = purgeSQL
	LoadCursorSQL        = loadCursorSQL
	PendingFloorSQL      = pendingFloorSQL
	LoadFloorSQL         = loadFloorSQL
	FloorSettings        = floorSettings
)

// Floor is floor, for the first start's cost test.
func (s *Store) Floor(ctx context.Context) (*int64, error) { return s.floor(ctx) }
