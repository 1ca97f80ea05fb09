package migrations

// Files are the embedded migrations, for tests that apply them the way an
// earlier install did (recorded in goose_db_version).
var Files = files
