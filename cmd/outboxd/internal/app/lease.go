package app

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/term"
	"github.com/outboxd/outboxd/lock/etcdlease"
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
	switch a.Cfg.Lock.Backend {
	case config.LockPostgres:
		return a.newPostgresLease(ctx)
	case config.LockEtcd:
		return a.newEtcdLease(ctx)
	}
	a.Locks = redislease.New(a.Nodes, redislease.WithKeyPrefix(a.Cfg.Redis.KeyPrefix), redislease.WithHooks(term.Hooks(a.Metrics)))
	return nil
}

// newPostgresLease builds the Postgres lease on a pool of its own.
func (a *App) newPostgresLease(ctx context.Context) error {
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

// newEtcdLease builds the etcd lease on a client of its own (lock.etcd.*).
// Without auth the client connects in the background. With auth it must
// log in first: while etcd cannot be reached it waits and retries, as for
// Redis; a refused login exits naming lock.etcd.password.
func (a *App) newEtcdLease(ctx context.Context) error {
	e := a.Cfg.Lock.Etcd
	tc, err := tlsConfig("lock.etcd.tls", e.TLS)
	if err != nil {
		return err
	}
	cfg := clientv3.Config{
		Endpoints: e.Endpoints, DialTimeout: e.DialTimeout, Username: e.Username, Password: e.Password,
		TLS: tc, Context: context.WithoutCancel(ctx), Logger: zap.NewNop(),
	}
	for {
		cli, err := clientv3.New(cfg)
		switch {
		case err == nil:
			a.leaseEtcd = cli
			a.Locks = etcdlease.New(cli, etcdlease.WithKeyPrefix(e.KeyPrefix), etcdlease.WithHooks(term.Hooks(a.Metrics)))
			return nil
		case errors.Is(err, rpctypes.ErrAuthFailed), errors.Is(err, rpctypes.ErrAuthNotEnabled):
			return &config.KeyError{Key: a.Cfg.SourceKey("lock.etcd.password"), Err: err}
		}
		a.Log.Warn("etcd unreachable, retrying", "error", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("etcd: %w", errors.Join(err, ctx.Err()))
		case <-time.After(time.Second):
		}
	}
}
