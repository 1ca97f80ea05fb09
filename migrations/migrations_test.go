package migrations_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/migrations"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// appMigrations is an application's goose migrations 1..n, each creating a
// table app_<version>, recorded in goose's default table.
func appMigrations(n int) fstest.MapFS {
	fsys := fstest.MapFS{}
	for v := 1; v <= n; v++ {
		fsys[fmt.Sprintf("%05d_app.sql", v)] = &fstest.MapFile{
			Data: fmt.Appendf(nil, "-- +goose Up\nCREATE TABLE app_%d (id int);\n-- +goose Down\nDROP TABLE app_%d;\n", v, v),
		}
	}
	return fsys
}

// gooseUp applies fsys with goose's defaults (goose_db_version), as an
// application or an earlier outboxd did; it returns the versions applied.
func gooseUp(t *testing.T, db *sql.DB, fsys fstest.MapFS, opts ...goose.ProviderOption) []int64 {
	t.Helper()
	p, err := goose.NewProvider(goose.DialectPostgres, db, fsys, append(opts, goose.WithDisableGlobalRegistry(true))...)
	if err != nil {
		t.Fatal(err)
	}
	res, err := p.Up(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []int64
	for _, r := range res {
		out = append(out, r.Source.Version)
	}
	return out
}

func open(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// versions lists table's applied versions (0 included), oldest first.
func versions(t *testing.T, db *sql.DB, table string) []int64 {
	t.Helper()
	rows, err := db.Query("SELECT version_id FROM " + table + " WHERE is_applied ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
	return out
}

func requireVersions(t *testing.T, db *sql.DB, table string, want []int64) {
	t.Helper()
	if got := versions(t, db, table); !slices.Equal(got, want) {
		t.Errorf("%s records %v, want %v", table, got, want)
	}
}

// latest is the newest embedded migration's version.
func latest(t *testing.T) int64 {
	t.Helper()
	entries, err := migrations.Files.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, e := range entries {
		if v, err := strconv.ParseInt(strings.SplitN(e.Name(), "_", 2)[0], 10, 64); err == nil && strings.HasSuffix(e.Name(), ".sql") {
			n = max(n, v)
		}
	}
	return n
}

// versionsOf is the versions of applied, in order.
func versionsOf(applied []migrations.Result) []int64 {
	var out []int64
	for _, r := range applied {
		out = append(out, r.Version)
	}
	return out
}

func upTo(n int64) []int64 {
	var out []int64
	for v := range n + 1 {
		out = append(out, v)
	}
	return out
}

func exists(t *testing.T, db *sql.DB, rel string) bool {
	t.Helper()
	var ok bool
	if err := db.QueryRow("SELECT to_regclass(@rel) IS NOT NULL", pgx.NamedArgs{"rel": rel}).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

// outboxdSchema lists what the last migration leaves: the relay's tables,
// columns and indexes.
func requireOutboxdSchema(t *testing.T, db *sql.DB) {
	t.Helper()
	for _, rel := range []string{"outbox", "outbox_fence", "reconcile_runs", "outbox_cursor", "outbox_pending_idx", "outbox_backoff_idx", "outbox_dead_list_idx"} {
		if !exists(t, db, rel) {
			t.Errorf("%s missing after migrate", rel)
		}
	}
	if _, err := db.Exec("SELECT owner FROM outbox_fence; SELECT txid FROM outbox; SELECT sent, horizon FROM outbox_cursor"); err != nil {
		t.Errorf("columns missing after migrate: %v", err)
	}
}

func TestMigrateAfterTheApplicationsGoose(t *testing.T) {
	dsn := testenv.EmptyDSN(t)
	db := open(t, dsn)
	gooseUp(t, db, appMigrations(12))
	before := versions(t, db, "goose_db_version")

	applied, err := migrations.Up(context.Background(), dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(applied)) != latest(t) {
		t.Fatalf("applied %d migrations, want %d", len(applied), latest(t))
	}
	requireOutboxdSchema(t, db)
	requireVersions(t, db, migrations.Table, upTo(latest(t)))
	requireVersions(t, db, "goose_db_version", before)
}

func TestTheApplicationsGooseAfterMigrate(t *testing.T) {
	dsn := testenv.EmptyDSN(t)
	db := open(t, dsn)
	if _, err := migrations.Up(context.Background(), dsn, nil); err != nil {
		t.Fatal(err)
	}
	if exists(t, db, "goose_db_version") {
		t.Error("migrate created goose_db_version")
	}
	if got := gooseUp(t, db, appMigrations(12)); !slices.Equal(got, upTo(12)[1:]) {
		t.Errorf("the application's goose applied %v, want 1..12", got)
	}
	for v := 1; v <= 12; v++ {
		if !exists(t, db, fmt.Sprintf("app_%d", v)) {
			t.Errorf("app_%d missing", v)
		}
	}
}

// An install whose migrations 1-9 went into goose_db_version, shared with
// the application's 10-12 (which goose then applied on top): migrate
// carries 1-9 over, applies only the migrations after them, and leaves
// goose_db_version as it was.
func TestMigrateCarriesOverGooseDBVersion(t *testing.T) {
	dsn := testenv.EmptyDSN(t)
	db := open(t, dsn)
	gooseUp(t, db, fstest.MapFS(filesOf(t)))
	gooseUp(t, db, appMigrations(12), goose.WithAllowOutofOrder(true))
	before := versions(t, db, "goose_db_version")

	var carried []int64
	applied, err := migrations.Up(context.Background(), dsn, func(r migrations.Result) {
		if r.CarriedOver {
			carried = append(carried, r.Version)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := versionsOf(applied); !slices.Equal(got, upTo(latest(t))[10:]) || !slices.Equal(carried, upTo(9)[1:]) {
		t.Errorf("applied %v, carried over %v; want 1..9 carried over and only the later ones applied", got, carried)
	}
	requireVersions(t, db, migrations.Table, upTo(latest(t)))
	requireVersions(t, db, "goose_db_version", before)
}

// Only the versions whose objects exist are carried over: an install that
// stopped after migration 5 gets 6 and every later one applied.
func TestMigrateCarriesOverOnlyWhatExists(t *testing.T) {
	dsn := testenv.EmptyDSN(t)
	db := open(t, dsn)
	fsys := filesUpTo(t, 5)
	gooseUp(t, db, fsys)
	applied, err := migrations.Up(context.Background(), dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := versionsOf(applied), upTo(latest(t))[6:]; !slices.Equal(got, want) {
		t.Errorf("applied %v, want %v", got, want)
	}
	requireOutboxdSchema(t, db)
}

// Replicas migrating at once, some carrying over: each succeeds, and every
// migration is recorded once.
func TestConcurrentMigrate(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		t.Run(fmt.Sprint("legacy=", legacy), func(t *testing.T) {
			dsn := testenv.EmptyDSN(t)
			db := open(t, dsn)
			if legacy {
				gooseUp(t, db, fstest.MapFS(filesOf(t)))
			}
			var wg sync.WaitGroup
			errs := make(chan error, 4)
			for range 4 {
				wg.Go(func() {
					_, err := migrations.Up(context.Background(), dsn, nil)
					errs <- err
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Error(err)
				}
			}
			requireVersions(t, db, migrations.Table, upTo(latest(t)))
			requireOutboxdSchema(t, db)
		})
	}
}

// filesUpTo is filesOf with migrations 1..n only.
func filesUpTo(t *testing.T, n int) fstest.MapFS {
	fsys := filesOf(t)
	for name := range fsys {
		if name >= fmt.Sprintf("%05d", n+1) {
			delete(fsys, name)
		}
	}
	return fsys
}

// filesOf copies the embedded migrations 1-9 into a map file system.
func filesOf(t *testing.T) fstest.MapFS {
	t.Helper()
	out := fstest.MapFS{}
	entries, err := migrations.Files.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() > "00010" {
			continue
		}
		b, err := migrations.Files.ReadFile(e.Name())
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = &fstest.MapFile{Data: b}
	}
	return out
}

// Through PgBouncer in transaction mode, replicas migrating at once each
// succeed and every migration is applied once.
func TestMigrateThroughATransactionPooler(t *testing.T) {
	dsn := testenv.EmptyDSN(t)
	via := testenv.StartPgBouncer(t, dsn).Via(dsn)
	errs := make(chan error, 3)
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			_, err := migrations.Up(context.Background(), via, nil, migrations.WithTransactionPooler())
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	db := open(t, dsn)
	requireVersions(t, db, migrations.Table, upTo(latest(t)))
	requireOutboxdSchema(t, db)
}

// postgres.schema: migrate creates the schema and everything in it; behind
// a transaction pooler the schema must come from the role's search_path.
func TestMigrateIntoASchema(t *testing.T) {
	dsn := testenv.EmptyDSN(t)
	ctx := context.Background()
	if _, err := migrations.Up(ctx, dsn, nil, migrations.WithSchema("relay_a")); err != nil {
		t.Fatal(err)
	}
	db := open(t, dsn)
	requireVersions(t, db, "relay_a."+migrations.Table, upTo(latest(t)))
	if !exists(t, db, "relay_a.outbox") || exists(t, db, "public.outbox") {
		t.Error("want relay_a.outbox and no public.outbox")
	}

	pooled := []migrations.Option{migrations.WithSchema("relay_b"), migrations.WithTransactionPooler()}
	_, err := migrations.Up(ctx, testenv.StartPgBouncer(t, dsn).Via(dsn), nil, pooled...)
	if !errors.Is(err, migrations.ErrSearchPath) {
		t.Fatalf("through a transaction pooler, role without search_path: %v, want ErrSearchPath", err)
	}
	if _, err := db.Exec(`DO $$ BEGIN
		EXECUTE format('ALTER ROLE postgres IN DATABASE %I SET search_path = relay_b', current_database()); END $$`); err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.Up(ctx, testenv.StartPgBouncer(t, dsn).Via(dsn), nil, pooled...); err != nil {
		t.Fatal(err)
	}
	requireVersions(t, db, "relay_b."+migrations.Table, upTo(latest(t)))
	if !exists(t, db, "relay_b.outbox_cursor") {
		t.Error("relay_b.outbox_cursor missing")
	}
}

// A migrate cut short in migration 6 (CREATE INDEX CONCURRENTLY, outside a
// transaction) leaves an invalid index behind and no record of 6; the next
// run completes 6-9 and the index is valid.
func TestMigrateCompletesAnInterruptedRun(t *testing.T) {
	dsn := testenv.EmptyDSN(t)
	db := open(t, dsn)
	fsys := filesUpTo(t, 5)
	gooseUp(t, db, fsys, goose.WithTableName(migrations.Table))
	// What an interrupted CONCURRENTLY build leaves: an index marked invalid.
	if _, err := db.Exec(`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('a', '1', 'e', '{}'), ('a', '1', 'e', '{}')`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE UNIQUE INDEX CONCURRENTLY outbox_dead_list_idx ON outbox (aggregate_type)`); err == nil {
		t.Fatal("the unique index over duplicates was built")
	}
	var valid bool
	if err := db.QueryRow(`SELECT indisvalid FROM pg_index WHERE indexrelid = 'outbox_dead_list_idx'::regclass`).Scan(&valid); err != nil || valid {
		t.Fatalf("want an invalid outbox_dead_list_idx left behind (valid %v, %v)", valid, err)
	}

	if _, err := migrations.Up(context.Background(), dsn, nil); err != nil {
		t.Fatal(err)
	}
	requireVersions(t, db, migrations.Table, upTo(latest(t)))
	requireOutboxdSchema(t, db)
	if err := db.QueryRow(`SELECT indisvalid FROM pg_index WHERE indexrelid = 'outbox_dead_list_idx'::regclass`).Scan(&valid); err != nil || !valid {
		t.Errorf("outbox_dead_list_idx valid %v (%v), want valid", valid, err)
	}
}

// An install that stopped after outboxd's migration 1, in a database whose
// application recorded its own versions 2 and 3 in goose_db_version: only
// version 1 is outboxd's (its objects exist; migration 2's column does
// not), so migrate carries 1 over and applies 2 and every later one.
func TestMigrateCarriesOverNoApplicationVersion(t *testing.T) {
	dsn := testenv.EmptyDSN(t)
	db := open(t, dsn)
	gooseUp(t, db, filesUpTo(t, 1))
	app := appMigrations(3)
	delete(app, "00001_app.sql")
	gooseUp(t, db, app, goose.WithAllowOutofOrder(true))
	requireVersions(t, db, "goose_db_version", upTo(3))

	var carried []int64
	applied, err := migrations.Up(context.Background(), dsn, func(r migrations.Result) {
		if r.CarriedOver {
			carried = append(carried, r.Version)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := versionsOf(applied); !slices.Equal(carried, []int64{1}) || !slices.Equal(got, upTo(latest(t))[2:]) {
		t.Errorf("carried over %v, applied %v; want 1 carried over, 2..%d applied", carried, got, latest(t))
	}
	requireOutboxdSchema(t, db)
}
