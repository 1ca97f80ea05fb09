package store

// Exported for the dead-letter list's plan test: it EXPLAINs the statement.
var DeadListSQL = deadListSQL
