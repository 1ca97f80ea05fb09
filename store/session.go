package store

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// plannerSettings are the session settings every statement here is
// written for (see OpenConfig).
var plannerSettings = map[string]string{
	"plan_cache_mode":                 "force_generic_plan",
	"jit":                             "off",
	"enable_seqscan":                  "off",
	"max_parallel_workers_per_gather": "0",
}

// Option configures Open and OpenConfig (and migrations.Up): WithSchema,
// WithTransactionPooler.
type Option func(*Session)

// Session is how outboxd's sessions are set up: Options resolved.
type Session struct {
	// Schema goes first in search_path; "" leaves the server's as it is.
	Schema string
	// TransactionPooler: the DSN reaches a proxy that lends a server
	// session per transaction; no state is kept on a session.
	TransactionPooler bool
}

// WithSchema puts schema first in the sessions' search_path: every
// statement finds outboxd's tables, functions and triggers there.
// "public" (the default of postgres.schema) leaves the server's
// search_path as it is.
func WithSchema(schema string) Option {
	return func(s *Session) {
		if schema != "public" {
			s.Schema = schema
		}
	}
}

// WithTransactionPooler keeps no state on a server session, for a DSN that
// points at a proxy lending a session per transaction (PgBouncer
// pool_mode = transaction): no startup parameters beyond the DSN's (the
// planner settings and search_path are set in each transaction, see
// perTx), and no prepared statement outliving its call (pgx's exec mode).
func WithTransactionPooler() Option {
	return func(s *Session) { s.TransactionPooler = true }
}

// Resolve applies opts.
func Resolve(opts []Option) Session {
	var s Session
	for _, opt := range opts {
		opt(&s)
	}
	return s
}

// Configure sets cfg's protocol and search_path startup parameter: behind
// a transaction pooler pgx's exec mode (an unnamed statement per call) and
// no search_path (the store sets it per transaction; migrations.Up takes
// the role's).
func (s Session) Configure(cfg *pgx.ConnConfig) {
	if s.TransactionPooler {
		cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
		return
	}
	if s.Schema != "" {
		cfg.RuntimeParams["search_path"] = s.Schema
	}
}

// configure sets cfg for o and returns the settings a session must show
// (CheckSession).
func configure(o Session, cfg *pgx.ConnConfig) map[string]string {
	o.Configure(cfg)
	want := map[string]string{}
	if o.TransactionPooler {
		maps.Copy(want, plannerSettings)
		return want
	}
	for k, v := range plannerSettings {
		if _, set := cfg.RuntimeParams[k]; !set {
			cfg.RuntimeParams[k] = v
			want[k] = v
		}
	}
	return want
}

// ErrSession: a server session does not have the settings outboxd asked
// for or relies on (a pooler refused or dropped the startup parameters),
// or outboxd's schema is missing.
var ErrSession = errors.New("store: the server's sessions lack outboxd's settings")

// SessionError says what a session lacks.
type SessionError struct {
	// Refused is the server's (or proxy's) refusal of the startup
	// parameters, when that is what happened.
	Refused string
	// Unprepared is the server's answer when a statement prepared on the
	// connection was gone at its next use: the connection's statements
	// reach different server sessions (a transaction pooler).
	Unprepared string
	// Settings are those whose value differs: "jit = on (want off)".
	Settings []string
	// Schema is set when current_schema() is not the configured schema.
	Schema string
}

func (e *SessionError) Error() string {
	var parts []string
	if e.Refused != "" {
		parts = append(parts, "the server refused the startup parameters: "+e.Refused)
	}
	if e.Unprepared != "" {
		parts = append(parts, "a statement prepared on the connection was gone at its next use: "+e.Unprepared)
	}
	if len(e.Settings) > 0 {
		parts = append(parts, "settings not in effect: "+strings.Join(e.Settings, ", "))
	}
	if e.Schema != "" {
		parts = append(parts, e.Schema)
	}
	return strings.Join(parts, "; ")
}

func (e *SessionError) Unwrap() error { return ErrSession }

// checkSessionQ is session.sql's check_session.
var checkSessionQ = stmt("check_session")

// CheckSession verifies, as the store's statements run (behind a
// transaction pooler, with the settings each transaction sets), that the
// settings outboxd relies on are in effect and that current_schema() is
// outboxd's schema. It returns a *SessionError (errors.Is ErrSession) when
// they are not; any other error means Postgres did not answer, and the
// caller retries.
func (s *Store) CheckSession(ctx context.Context) error {
	names := slices.Sorted(maps.Keys(s.want))
	var schema string
	var values []string
	err := checkSessionQ.queryRow(ctx, s.db, pgx.NamedArgs{"names": names}).Scan(&schema, &values)
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "08P01" && strings.Contains(pgErr.Message, "startup parameter") {
			return &SessionError{Refused: pgErr.Message}
		}
		// 26000: prepared statement does not exist; 42P05: it already
		// exists. Either way the statement met another server session
		// than the one it was prepared on.
		if errors.As(err, &pgErr) && (pgErr.Code == "26000" || pgErr.Code == "42P05") {
			return &SessionError{Unprepared: pgErr.Message}
		}
		return fmt.Errorf("store: check session: %w", err)
	}
	e := &SessionError{}
	for i, n := range names {
		if values[i] != s.want[n] {
			e.Settings = append(e.Settings, fmt.Sprintf("%s = %s (want %s)", n, values[i], s.want[n]))
		}
	}
	if s.schema != "" && schema != s.schema {
		e.Schema = fmt.Sprintf("current_schema() is %q, want %q (the schema must exist: `outboxd migrate` creates it)", schema, s.schema)
	}
	if len(e.Settings) == 0 && e.Schema == "" {
		return nil
	}
	return e
}
