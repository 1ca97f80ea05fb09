package app

import (
	"cmp"
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/term"
	"github.com/outboxd/outboxd/lock/pglease"
	"github.com/outboxd/outboxd/lock/redislease"
)

// leaseConns bounds the Postgres lease's own pool: the two locks' renewals
// and acquisitions, and a waiter's LISTEN connection.
const leaseConns = 4

// newLease builds lock.backend's lease. The Postgres lease runs on a small
// pool of its own, so its renewals never queue behind delivery; its
// sessions are named "<application_name> lease".
func (a *App) newLease(ctx context.Context) error {
	if a.Cfg.Lock.Backend != config.LockPostgres {
		a.Locks = redislease.New(a.Nodes, redislease.WithKeyPrefix(a.Cfg.Redis.KeyPrefix), redislease.WithHooks(term.Hooks(a.Metrics)))
		return nil
	}
	c := a.Cfg.Postgres
	cfg, err := pgxpool.ParseConfig(c.DSN)
	if err != nil {
		return &config.KeyError{Key: "postgres.dsn", Err: fmt.Errorf("parse: %w", err)}
	}
	params := cfg.ConnConfig.RuntimeParams
	params["application_name"] = cmp.Or(params["application_name"], "outboxd") + " lease"
	cfg.MaxConns, cfg.MinConns = leaseConns, 0
	opts := []pglease.Option{pglease.WithHooks(term.Hooks(a.Metrics))}
	if c.Schema != "public" {
		opts = append(opts, pglease.WithSchema(c.Schema))
	}
	if c.Pooler == config.PoolerTransaction {
		// No prepared statement kept, and no LISTEN: waiters poll.
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
		opts = append(opts, pglease.WithoutListen())
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("lease pool: %w", err)
	}
	a.leasePool = pool
	a.Locks = pglease.New(pool, opts...)
	return nil
}
