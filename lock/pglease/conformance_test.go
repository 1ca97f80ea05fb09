package pglease_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/lock"
	"github.com/outboxd/outboxd/lock/leasetest"
	"github.com/outboxd/outboxd/lock/pglease"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// pool opens a pool on dsn, closed at cleanup; via a transaction pooler
// it keeps no prepared statements.
func pool(t *testing.T, dsn string, txPooler bool) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if txPooler {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	}
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// subject is the Postgres lease on the database at dsn: each replica on a
// pool of its own, as replicas are. Remove expires the lease in place
// (the row and its token stay, as after an expiry); Steal hands it to
// another owner.
func subject(t *testing.T, dsn string) leasetest.Subject {
	admin := pool(t, dsn, false)
	return leasetest.Subject{
		Replica: func() lock.Lease { return pglease.New(pool(t, dsn, false)) },
		Remove: func(ctx context.Context, name string) error {
			_, err := admin.Exec(ctx, `UPDATE outbox_leases SET expires_at = now() - interval '1 millisecond' WHERE lock_name = $1`, name)
			return err
		},
		Steal: func(ctx context.Context, name string) error {
			_, err := admin.Exec(ctx, `UPDATE outbox_leases SET owner = 'thief', instance = NULL, expires_at = now() + interval '10 minutes' WHERE lock_name = $1`, name)
			return err
		},
		Waiting: func(ctx context.Context, name string) bool {
			var n int
			err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND query = 'LISTEN '||$1::text`, pglease.Channel).Scan(&n)
			return err == nil && n > 0
		},
	}
}

// The Postgres lease passes the lease conformance suite.
func TestConformance(t *testing.T) {
	t.Parallel()
	leasetest.Run(t, func(t *testing.T) leasetest.Subject {
		return subject(t, testenv.DSN(t))
	})
}
