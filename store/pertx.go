package store

import (
	"context"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// db is what the store's statements run on: the pool itself, or behind a
// transaction pooler a perTx over it.
type db interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// perTx runs every statement with the session settings the store's
// statements are written for (plannerSettings, and search_path when a
// schema is set) in effect for that statement's transaction alone, so a
// proxy that lends a server session per transaction needs no settings on
// the role and no reconnect.
//
// Guarantee: a statement is planned and run with the settings in effect,
// and they end with its transaction. A single statement goes in one
// pipeline with a set_config(..., true) statement before it, ended by
// one Sync: both run in one implicit transaction, the statement planned
// after set_config ran (a set_config inside the statement itself would
// run after the statement was planned). A transaction starts with SET
// LOCAL statements sent with its BEGIN in one simple-protocol message.
// Neither costs a round trip.
type perTx struct {
	pool *pgxpool.Pool
	// set is the statement sent before each single statement.
	set string
	// local follows each BEGIN.
	local string
}

// newPerTx is a perTx with settings, and schema first in search_path
// when it is not "".
func newPerTx(pool *pgxpool.Pool, settings map[string]string, schema string) *perTx {
	all := maps.Clone(settings)
	if schema != "" {
		all["search_path"] = pgx.Identifier{schema}.Sanitize()
	}
	var calls, locals []string
	for _, k := range slices.Sorted(maps.Keys(all)) {
		calls = append(calls, "set_config("+literal(k)+", "+literal(all[k])+", true)")
		locals = append(locals, "; SET LOCAL "+k+" = "+literal(all[k]))
	}
	return &perTx{pool: pool, set: "SELECT " + strings.Join(calls, ", "), local: strings.Join(locals, "")}
}

func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// Query runs sql after the settings, in one transaction.
func (p *perTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	b := &pgx.Batch{}
	b.Queue(p.set)
	b.Queue(sql, args...)
	br := p.pool.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, err
	}
	return &batchRows{Rows: rows, br: br}, nil
}

// QueryRow is Query for one row, as pgx's QueryRow.
func (p *perTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, err := p.Query(ctx, sql, args...)
	return batchRow{rows: rows, err: err}
}

// Begin starts a transaction with the settings SET LOCAL.
func (p *perTx) Begin(ctx context.Context) (pgx.Tx, error) {
	return p.BeginTx(ctx, pgx.TxOptions{})
}

// BeginTx starts a transaction of opts with the settings SET LOCAL, sent
// with the BEGIN (pgx sends a BEGIN without arguments as a simple query).
func (p *perTx) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	if opts.BeginQuery == "" {
		opts.BeginQuery = beginSQL(opts)
	}
	opts.BeginQuery += p.local
	return p.pool.BeginTx(ctx, opts)
}

// beginSQL is the BEGIN pgx sends for opts.
func beginSQL(opts pgx.TxOptions) string {
	parts := []string{"BEGIN"}
	if opts.IsoLevel != "" {
		parts = append(parts, "ISOLATION LEVEL", string(opts.IsoLevel))
	}
	if opts.AccessMode != "" {
		parts = append(parts, string(opts.AccessMode))
	}
	if opts.DeferrableMode != "" {
		parts = append(parts, string(opts.DeferrableMode))
	}
	return strings.Join(parts, " ")
}

// batchRows are the statement's rows; the pipeline (and its connection)
// ends when they are read or closed, and an error ending it (the implicit
// transaction's commit) is the rows' error.
type batchRows struct {
	pgx.Rows
	br     pgx.BatchResults
	closed bool
	err    error
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *batchRows) Close() {
	if r.closed {
		return
	}
	r.closed = true
	r.Rows.Close()
	r.err = r.br.Close()
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

// batchRow is pgx's QueryRow over batchRows.
type batchRow struct {
	rows pgx.Rows
	err  error
}

func (r batchRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}
