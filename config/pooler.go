package config

import (
	"regexp"
	"strings"
)

// Values of postgres.pooler.
const (
	// PoolerNone: the DSN reaches a Postgres server session that outboxd
	// keeps (startup parameters, prepared statements, LISTEN).
	PoolerNone = "none"
	// PoolerTransaction: the DSN reaches a proxy that lends a server session
	// per transaction (PgBouncer pool_mode = transaction, RDS Proxy,
	// Supavisor); outboxd keeps no state on a session.
	PoolerTransaction = "transaction"
)

// schemaName is what postgres.schema accepts: a lower-case identifier that
// needs no quoting, so it reads the same in SQL, in search_path and in
// goose's table name.
var schemaName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

func (c *Config) validatePooler() error {
	switch c.Postgres.Pooler {
	case PoolerNone, PoolerTransaction:
	default:
		return bad("postgres.pooler", "must be %s or %s, got %q", PoolerNone, PoolerTransaction, c.Postgres.Pooler)
	}
	if !schemaName.MatchString(c.Postgres.Schema) {
		return bad("postgres.schema", "must be a lower-case identifier (letters, digits, _; at most 63), got %q", c.Postgres.Schema)
	}
	if systemSchema(c.Postgres.Schema) {
		return bad("postgres.schema", "%q is Postgres's own (pg_* and information_schema are reserved to the system): choose a schema of your own", c.Postgres.Schema)
	}
	return nil
}

// systemSchema: Postgres reserves the schema name to itself (CREATE SCHEMA
// refuses pg_*; pg_catalog, pg_temp and information_schema hold the
// system's objects), so `migrate` would fail on it.
func systemSchema(name string) bool {
	return strings.HasPrefix(name, "pg_") || name == "information_schema"
}

// validateNotifyPooler refuses poller.notify with a transaction pooler:
// LISTEN needs a session of its own, which such a pooler does not keep.
func (c *Config) validateNotifyPooler() error {
	if c.Poller.Notify && c.Postgres.Pooler == PoolerTransaction {
		return bad("poller.notify", "poller.notify: true needs LISTEN on a session of its own, which postgres.pooler: %s does not keep; "+
			"set poller.notify: false (the poller polls every poller.poll_interval)", PoolerTransaction)
	}
	return nil
}
