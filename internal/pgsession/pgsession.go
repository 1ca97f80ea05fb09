// Package pgsession holds how outboxd's Postgres sessions are set up: the
// schema they find outboxd's objects in and whether a transaction pooler
// stands between them and the server. store and migrations read it.
package pgsession

import "github.com/jackc/pgx/v5"

// Option sets one part of Settings.
type Option func(*Settings)

// Settings are the options resolved.
type Settings struct {
	// Schema goes first in search_path; "" leaves the server's as it is.
	Schema string
	// TransactionPooler: the DSN reaches a proxy that lends a server
	// session per transaction (PgBouncer pool_mode = transaction): no
	// startup parameters beyond the DSN's, no prepared statement kept.
	TransactionPooler bool
}

// WithSchema puts schema first in the sessions' search_path. "public"
// (postgres.schema's default) leaves the server's search_path as it is.
func WithSchema(schema string) Option {
	return func(s *Settings) {
		if schema != "public" {
			s.Schema = schema
		}
	}
}

// WithTransactionPooler keeps no state on a server session.
func WithTransactionPooler() Option {
	return func(s *Settings) { s.TransactionPooler = true }
}

// Resolve applies opts.
func Resolve(opts []Option) Settings {
	var s Settings
	for _, opt := range opts {
		opt(&s)
	}
	return s
}

// Configure sets cfg's protocol and search_path startup parameter for s:
// behind a transaction pooler pgx's exec mode (an unnamed statement per
// call) and no search_path (the role's, see docs/operations.md).
func (s Settings) Configure(cfg *pgx.ConnConfig) {
	if s.TransactionPooler {
		cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
		return
	}
	if s.Schema != "" {
		cfg.RuntimeParams["search_path"] = s.Schema
	}
}
