package app

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/migrations"
	"github.com/outboxd/outboxd/store"
)

// OpenStore opens the pool for the postgres section: its schema and,
// behind a transaction pooler, no state kept on a server session.
func OpenStore(ctx context.Context, c config.Postgres) (*store.Store, error) {
	opts := []store.Option{store.WithSchema(c.Schema)}
	if c.Pooler == config.PoolerTransaction {
		opts = append(opts, store.WithTransactionPooler())
	}
	return store.Open(ctx, c.DSN, opts...)
}

// opsStatementTimeout bounds each statement of the operations pool where
// the server takes it as a startup parameter; behind a transaction pooler
// (no startup parameters) the requests' context deadlines cancel them.
const opsStatementTimeout = "5s"

// OpenOpsStore opens the operations endpoints' own pool for the postgres
// section: at most conns connections, none opened before a request needs
// one. Every /dead, /dead/{id}, /status and scrape reads through it, so
// a crowd of operations requests waits on its own connections and never
// takes one of the delivery's (the pool OpenStore opens). Its sessions
// are named "<application_name> ops" ("outboxd ops" when the DSN names
// none), so pg_stat_activity tells them from the delivery's.
func OpenOpsStore(ctx context.Context, c config.Postgres, conns int) (*store.Store, error) {
	cfg, err := pgxpool.ParseConfig(c.DSN)
	if err != nil {
		return nil, fmt.Errorf("store: parse postgres.dsn: %w", err)
	}
	params := cfg.ConnConfig.RuntimeParams
	params["application_name"] = cmp.Or(params["application_name"], "outboxd") + " ops"
	cfg.MaxConns, cfg.MinConns = int32(conns), 0 //nolint:gosec // http.max_concurrent is at most 64
	opts := []store.Option{store.WithSchema(c.Schema)}
	if c.Pooler == config.PoolerTransaction {
		opts = append(opts, store.WithTransactionPooler())
	} else if _, set := params["statement_timeout"]; !set {
		params["statement_timeout"] = opsStatementTimeout
	}
	return store.OpenConfig(ctx, cfg, opts...)
}

// MigrateOptions are migrations.Up's options for the postgres section.
func MigrateOptions(c config.Postgres) []migrations.Option {
	opts := []migrations.Option{migrations.WithSchema(c.Schema)}
	if c.Pooler == config.PoolerTransaction {
		opts = append(opts, migrations.WithTransactionPooler())
	}
	return opts
}

// awaitSession waits until Postgres answers and checks that its sessions
// have outboxd's settings (store.CheckSession): a pooler that refused or
// dropped them stops the start with an error naming postgres.pooler, a
// missing schema one naming postgres.schema, never a relay running with
// them silently lost. Behind a transaction pooler the settings come with
// each transaction, so the role needs none. It returns nil when ctx ends
// first.
func (a *App) awaitSession(ctx context.Context) error {
	wait := 100 * time.Millisecond
	for {
		err := a.Store.CheckSession(ctx)
		var se *store.SessionError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &se):
			return sessionKeyError(a.Cfg.Postgres, se)
		}
		a.Log.Warn("postgres not reachable, retrying", "error", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// sessionKeyError says which key to change, and how.
func sessionKeyError(c config.Postgres, se *store.SessionError) error {
	if se.Refused == "" && se.Unprepared == "" && len(se.Settings) == 0 {
		return &config.KeyError{Key: "postgres.schema", Err: fmt.Errorf("%w: run `outboxd migrate` with postgres.schema: %s", se, c.Schema)}
	}
	hint := fmt.Sprintf("the DSN seems to reach a pooler that does not keep outboxd's session settings (PgBouncer?): "+
		"set postgres.pooler: %s (docs/operations.md, \"Behind a connection pooler\")", config.PoolerTransaction)
	if c.Pooler == config.PoolerTransaction {
		hint = "the settings outboxd sets in each transaction were not in effect: does the DSN reach a pooler in statement mode?"
	}
	return &config.KeyError{Key: "postgres.pooler", Err: fmt.Errorf("%w: %s", se, hint)}
}

// PoolerRefusal turns err into an error naming postgres.pooler when a
// proxy refused the startup parameters outboxd sends (a one-shot command
// behind PgBouncer without postgres.pooler: transaction); else it returns
// err.
func PoolerRefusal(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "08P01" && strings.Contains(pgErr.Message, "startup parameter") {
		return &config.KeyError{Key: "postgres.pooler", Err: fmt.Errorf("%w: the DSN seems to reach a transaction pooler (PgBouncer?): "+
			"set postgres.pooler: %s (docs/operations.md, \"Behind a connection pooler\")", err, config.PoolerTransaction)}
	}
	return err
}
