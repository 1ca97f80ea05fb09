package store

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
