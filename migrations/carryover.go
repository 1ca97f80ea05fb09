package migrations

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
)

// legacyTable is goose's default version table, where outboxd recorded its
// migrations 1-9 before it had a table of its own. The application may
// record its own migrations there too, under the same version numbers.
const legacyTable = "goose_db_version"

// leaves holds, per migration outboxd may have recorded in legacyTable, a
// condition that is true when the objects that migration leaves exist in
// the current schema. A version found in legacyTable is taken as outboxd's
// only when its condition holds: the application's migration of the same
// number leaves none of them. Migration 7 replaces migration 4's index.
var leaves = map[int64]string{
	1: and(rel("outbox"), rel("outbox_fence"), rel("outbox_pending_idx"), rel("outbox_pending_aggregate_idx"),
		rel("outbox_dispatched_idx"), "to_regprocedure(quote_ident(current_schema()) || '.outbox_notify()') IS NOT NULL"),
	2: col("outbox_fence", "owner"),
	3: rel("reconcile_runs"),
	4: "(" + valid("outbox_delayed_idx") + " OR " + valid("outbox_backoff_idx") + ")",
	5: and(col("outbox", "txid"), rel("outbox_cursor")),
	6: valid("outbox_dead_list_idx"),
	7: valid("outbox_backoff_idx"),
	8: col("outbox_cursor", "sent"),
	9: col("outbox_cursor", "horizon"),
}

func and(conds ...string) string { return "(" + strings.Join(conds, " AND ") + ")" }

// regclass is the relation name in the current schema, or NULL.
func regclass(name string) string {
	return "to_regclass(quote_ident(current_schema()) || '." + name + "')"
}

func rel(name string) string { return regclass(name) + " IS NOT NULL" }

func col(table, column string) string {
	return "EXISTS (SELECT FROM pg_attribute WHERE attrelid = " + regclass(table) +
		" AND attname = '" + column + "' AND NOT attisdropped)"
}

func valid(index string) string {
	return "EXISTS (SELECT FROM pg_index WHERE indexrelid = " + regclass(index) + " AND indisvalid)"
}

// carryOver records in Table the migrations an earlier install recorded in
// legacyTable: the longest run 1..n of versions that legacyTable records
// as applied and whose objects exist. It runs in one transaction under the
// migrations' advisory lock, and only while Table does not exist, so it
// happens once, whole or not at all; legacyTable is only read. It returns
// the versions carried over.
//
// schema ("" for the server's search_path) is created first when missing,
// under the same lock, and made the transaction's search_path.
func carryOver(ctx context.Context, db *sql.DB, schema string) (n int64, err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("migrations: carry over: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
			err = fmt.Errorf("migrations: carry over from %s: %w", legacyTable, err)
			return
		}
		err = tx.Commit()
	}()
	if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock(@lock)", pgx.NamedArgs{"lock": lockID}); err != nil {
		return 0, err
	}
	if err := useSchema(ctx, tx, schema); err != nil {
		return 0, err
	}
	if needed, err := carryOverNeeded(ctx, tx); err != nil || !needed {
		return 0, err
	}
	if n, err = legacyAppliedRun(ctx, tx); err != nil || n == 0 {
		return 0, err
	}
	if err := recordVersions(ctx, tx, n); err != nil {
		return 0, err
	}
	return n, nil
}

// useSchema creates schema when missing and makes it tx's search_path; ""
// leaves the server's search_path.
func useSchema(ctx context.Context, tx *sql.Tx, schema string) error {
	if schema == "" {
		return nil
	}
	// Created only when missing: CREATE SCHEMA needs a privilege on the
	// database that a role owning an existing schema may not have.
	var missing bool
	if err := tx.QueryRowContext(ctx, "SELECT to_regnamespace(@schema) IS NULL", pgx.NamedArgs{"schema": schema}).Scan(&missing); err != nil {
		return err
	}
	if missing {
		if _, err := tx.ExecContext(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
			return err
		}
	}
	_, err := tx.ExecContext(ctx, "SELECT set_config('search_path', @schema, true)", pgx.NamedArgs{"schema": schema})
	return err
}

// carryOverNeeded reports whether legacyTable exists and Table does not.
func carryOverNeeded(ctx context.Context, tx *sql.Tx) (bool, error) {
	var ours, legacy bool
	if err := tx.QueryRowContext(ctx, "SELECT "+rel(Table)+", "+rel(legacyTable)).Scan(&ours, &legacy); err != nil {
		return false, err
	}
	return !ours && legacy, nil
}

// legacyAppliedRun returns the longest run 1..n of versions that
// legacyTable records as applied and whose objects exist (0: none).
func legacyAppliedRun(ctx context.Context, tx *sql.Tx) (n int64, err error) {
	for v := int64(1); v <= int64(len(leaves)); v++ {
		var ok bool
		q := "SELECT COALESCE((SELECT is_applied FROM " + legacyTable +
			" WHERE version_id = @version ORDER BY id DESC LIMIT 1), false) AND " + leaves[v]
		if err := tx.QueryRowContext(ctx, q, pgx.NamedArgs{"version": v}).Scan(&ok); err != nil {
			return 0, err
		}
		if !ok {
			break
		}
		n = v
	}
	return n, nil
}

// recordVersions creates Table and records versions 0..n in it as applied.
func recordVersions(ctx context.Context, tx *sql.Tx, n int64) error {
	st, err := database.NewStore(goose.DialectPostgres, Table)
	if err != nil {
		return err
	}
	if err := st.CreateVersionTable(ctx, tx); err != nil {
		return err
	}
	for v := int64(0); v <= n; v++ {
		if err := st.Insert(ctx, tx, database.InsertRequest{Version: v}); err != nil {
			return err
		}
	}
	return nil
}
