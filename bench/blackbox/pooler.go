package main

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/internal/testenv"
)

var viaPgBouncer = flag.Bool("pgbouncer", false, "the relay reaches Postgres through a PgBouncer of the bench's own in transaction "+
	"pooling mode (postgres.pooler=transaction; the planner settings as the role's settings in the run's database)")

// bouncer is the bench's one PgBouncer, started at first use.
var bouncer struct {
	once sync.Once
	b    *testenv.PgBouncer
}

// throughBouncer returns dsn pointed at the bench's PgBouncer and the
// settings the relay needs behind it, after giving the run's database
// the planner settings outboxd's role needs there. Without -pgbouncer it
// returns dsn unchanged.
func throughBouncer(ctx context.Context, dsn string) (string, []string) {
	if !*viaPgBouncer {
		return dsn, nil
	}
	bouncer.once.Do(func() {
		b, err := testenv.RunPgBouncer(dsn, freePortNumber())
		check(err)
		bouncer.b = b
		atExit(b.Stop)
		fmt.Fprintf(os.Stderr, "blackbox: the relay reaches Postgres through PgBouncer at %s (pool_mode transaction)\n", b.Addr)
	})
	conn, err := pgx.Connect(ctx, dsn)
	check(err)
	defer conn.Close(ctx)
	u, err := url.Parse(dsn)
	check(err)
	db := pgx.Identifier{strings.TrimPrefix(u.Path, "/")}.Sanitize()
	for _, set := range []string{"plan_cache_mode = force_generic_plan", "jit = off", "enable_seqscan = off",
		"max_parallel_workers_per_gather = 0"} {
		_, err := conn.Exec(ctx, "ALTER ROLE "+pgx.Identifier{u.User.Username()}.Sanitize()+" IN DATABASE "+db+" SET "+set)
		check(err)
	}
	return bouncer.b.Via(dsn), []string{"postgres.pooler=transaction"}
}
