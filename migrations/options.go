package migrations

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/outboxd/outboxd/store"
)

// Option configures Up: WithSchema, WithTransactionPooler.
type Option = store.Option

// WithSchema applies the migrations in schema, created when missing.
// "public" leaves the server's search_path as it is.
func WithSchema(schema string) Option { return store.WithSchema(schema) }

// WithTransactionPooler migrates through a proxy that lends a server
// session per transaction (PgBouncer pool_mode = transaction): no startup
// parameters, no prepared statements kept, and a lock row in a table
// (outboxd_migrations_lock, with a lease) instead of a session's advisory
// lock; the schema comes from the role's search_path (checkSchema).
func WithTransactionPooler() Option { return store.WithTransactionPooler() }

// locker is goose's session advisory lock (the one carryOver takes too, so
// a replica's goose run and another's carry-over never overlap), or behind
// a transaction pooler, where a session lock would stay on whichever
// server session took it, a lock row.
func locker(o store.Session) (goose.ProviderOption, error) {
	if o.TransactionPooler {
		l, err := lock.NewPostgresTableLocker(lock.WithTableName(Table + "_lock"))
		return goose.WithLocker(l), err
	}
	l, err := lock.NewPostgresSessionLocker(lock.WithLockID(lockID))
	return goose.WithSessionLocker(l), err
}

// ErrSearchPath: the sessions' current schema is not the one asked for;
// behind a transaction pooler it must come from the role's search_path.
var ErrSearchPath = errors.New("migrations: the sessions' search_path does not start with the schema")

// checkSchema verifies that statements outside a transaction see schema
// first (the server's search_path when schema is "").
func checkSchema(ctx context.Context, db *sql.DB, schema string) error {
	if schema == "" {
		return nil
	}
	var cur, role string
	if err := db.QueryRowContext(ctx, "SELECT COALESCE(current_schema(), ''), current_user").Scan(&cur, &role); err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	if cur != schema {
		return fmt.Errorf("%w: current_schema() is %q, want %q; run once: ALTER ROLE %s SET search_path = %s;",
			ErrSearchPath, cur, schema, pgx.Identifier{role}.Sanitize(), schema)
	}
	return nil
}
