// Package migrations holds outboxd's SQL schema, embedded in the binary, and
// applies it with goose under a lock, so several replicas can run
// `outboxd migrate` at once.
//
// outboxd records its migrations in a table of its own, outboxd_migrations,
// never in goose's default goose_db_version, which the application may use
// for its own migrations. An install that recorded them in goose_db_version
// is carried over (carryover.go) without touching that table.
package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/outboxd/outboxd/store"
)

//go:embed *.sql
var files embed.FS

// Table is where outboxd records the migrations it applied.
const Table = "outboxd_migrations"

// Result is one applied migration, or one carried over from legacyTable
// (CarriedOver: Source names that table, Duration is 0).
type Result struct {
	Version     int64
	Source      string
	Duration    time.Duration
	CarriedOver bool
}

// Up applies every pending migration to the database at dsn and returns
// them. progress, if not nil, is called after each one, and for each
// version carried over from goose_db_version first.
//
// Each migration runs in a transaction with its version record (the
// CONCURRENTLY ones, which cannot, start by dropping what an interrupted
// attempt left), so a failed run leaves the schema as the last applied
// migration made it, and the next run continues from there.
func Up(ctx context.Context, dsn string, progress func(Result), opts ...Option) ([]Result, error) {
	o := store.Resolve(opts)
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("migrations: parse dsn: %w", err)
	}
	o.Configure(cfg)
	if _, set := cfg.RuntimeParams["jit"]; !o.TransactionPooler && !set {
		// As on the relay's sessions. A transaction pooler refuses it
		// (PgBouncer's default): migrate then stops instead of taking a
		// session lock that a pooler would leave on whichever server
		// session ran it.
		cfg.RuntimeParams["jit"] = "off"
	}
	db := stdlib.OpenDB(*cfg)
	defer db.Close()
	carried, err := carryOver(ctx, db, o.Schema)
	if err != nil {
		return nil, err
	}
	for v := int64(1); v <= carried && progress != nil; v++ {
		progress(Result{Version: v, Source: legacyTable, CarriedOver: true})
	}
	if err := checkSchema(ctx, db, o.Schema); err != nil {
		return nil, err
	}
	lockOpt, err := locker(o)
	if err != nil {
		return nil, fmt.Errorf("migrations: locker: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, files,
		lockOpt, goose.WithTableName(Table), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	var out []Result
	for {
		r, err := p.UpByOne(ctx)
		if err != nil {
			if errors.Is(err, goose.ErrNoNextVersion) {
				return out, nil
			}
			return out, fmt.Errorf("migrations: %w", err)
		}
		res := Result{Version: r.Source.Version, Source: r.Source.Path, Duration: r.Duration}
		out = append(out, res)
		if progress != nil {
			progress(res)
		}
	}
}

// lockID is the advisory lock every `outboxd migrate` takes: goose's
// default, which outboxd has always used, so a replica of an older build
// migrating at the same moment waits as well.
const lockID = lock.DefaultLockID
