// Package migrations holds outboxd's SQL schema, embedded in the binary, and
// applies it with goose under a Postgres advisory lock, so several replicas can
// run `outboxd migrate` at once.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed *.sql
var files embed.FS

// Result is one applied migration.
type Result struct {
	Version  int64
	Source   string
	Duration string
}

// Up applies every pending migration to the database at dsn. progress, if
// not nil, is called after each one.
func Up(ctx context.Context, dsn string, progress func(Result)) ([]Result, error) {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, fmt.Errorf("migrations: open: %w", err)
	}
	defer db.Close()
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return nil, fmt.Errorf("migrations: locker: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, files, goose.WithSessionLocker(locker))
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
		res := Result{Version: r.Source.Version, Source: r.Source.Path, Duration: r.Duration.String()}
		out = append(out, res)
		if progress != nil {
			progress(res)
		}
	}
}

var _ = stdlib.GetDefaultDriver // registers the "pgx" database/sql driver
