// Package testenv gives tests real Postgres and Redis.
//
// Addresses come from OUTBOXD_TEST_POSTGRES_DSN and OUTBOXD_TEST_REDIS_ADDR,
// defaulting to the local services. When those are unreachable and a Docker
// engine answers, testcontainers-go starts them; otherwise the tests fail with
// a message saying what to start (never a silent skip).
//
// Isolation: each package gets a migrated template database of its own, each
// test a fresh database cloned from it, and each test its own Redis key
// prefix, so packages run in parallel against one server.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	tcredis "github.com/testcontainers/testcontainers-go/modules/redis"

	"github.com/outboxd/outboxd/internal/testkit"
	"github.com/outboxd/outboxd/migrations"
	"github.com/outboxd/outboxd/store"
)

var (
	baseDSN   string // server's maintenance database
	redisAddr string
	template  string // this package's migrated template database
)

// Main runs a package's tests: services up, template migrated, goleak after.
// Use it from TestMain: func TestMain(m *testing.M) { testenv.Main(m) }.
func Main(m *testing.M) {
	os.Exit(Run(m))
}

// Run is Main without the exit: it returns the exit code, so a TestMain
// with files of its own (a built binary) can remove them first. os.Exit
// skips deferred calls, so a defer before Main never runs.
func Run(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	stopContainers, err := services(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testenv:", err)
		return 1
	}
	defer stopContainers()
	template = "outboxd_tpl_" + randomHex(6)
	if err := createDB(ctx, template, ""); err != nil {
		fmt.Fprintln(os.Stderr, "testenv:", err)
		return 1
	}
	defer func() { _ = dropDB(context.Background(), template) }()
	if _, err := migrations.Up(ctx, withDB(baseDSN, template), nil); err != nil {
		fmt.Fprintln(os.Stderr, "testenv: migrate template:", err)
		return 1
	}
	code := m.Run()
	if code == 0 {
		if err := testkit.CheckLeaks(); err != nil {
			fmt.Fprintln(os.Stderr, "testenv: goroutine leak:", err)
			return 1
		}
	}
	return code
}

// services finds Postgres and Redis, or starts them in containers.
func services(ctx context.Context) (stop func(), err error) {
	baseDSN = envOr("OUTBOXD_TEST_POSTGRES_DSN", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable")
	redisAddr = envOr("OUTBOXD_TEST_REDIS_ADDR", "127.0.0.1:6379")
	stop = func() {}
	pgErr, redisErr := pingPostgres(ctx, baseDSN), pingRedis(ctx, redisAddr)
	if pgErr == nil && redisErr == nil {
		return stop, nil
	}
	if !dockerAvailable(ctx) {
		return stop, fmt.Errorf("cannot reach Postgres (%s: %v) or Redis (%s: %v), and no Docker engine answers; "+
			"start them (scripts/services.sh does) or point OUTBOXD_TEST_POSTGRES_DSN / OUTBOXD_TEST_REDIS_ADDR at running ones",
			redactedDSN(baseDSN), pgErr, redisAddr, redisErr)
	}
	var stops []func()
	stop = func() {
		for _, s := range stops {
			s()
		}
	}
	if pgErr != nil {
		c, err := tcpostgres.Run(ctx, "postgres:15-alpine", tcpostgres.BasicWaitStrategies())
		if err != nil {
			return stop, fmt.Errorf("start Postgres container: %w", err)
		}
		stops = append(stops, func() { _ = testcontainers.TerminateContainer(c) })
		if baseDSN, err = c.ConnectionString(ctx, "sslmode=disable"); err != nil {
			return stop, err
		}
	}
	if redisErr != nil {
		c, err := tcredis.Run(ctx, "redis:7-alpine")
		if err != nil {
			return stop, fmt.Errorf("start Redis container: %w", err)
		}
		stops = append(stops, func() { _ = testcontainers.TerminateContainer(c) })
		uri, err := c.ConnectionString(ctx)
		if err != nil {
			return stop, err
		}
		redisAddr = strings.TrimPrefix(uri, "redis://")
	}
	return stop, nil
}

func dockerAvailable(ctx context.Context) bool {
	defer func() { _ = recover() }() // the provider panics on some broken setups
	p, err := testcontainers.NewDockerProvider()
	if err != nil {
		return false
	}
	defer p.Close()
	hctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	return p.Health(hctx) == nil
}

func pingPostgres(ctx context.Context, dsn string) error {
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, dsn)
	if err != nil {
		return err
	}
	return conn.Close(cctx)
}

func pingRedis(ctx context.Context, addr string) error {
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	return c.Ping(cctx).Err()
}

func createDB(ctx context.Context, name, from string) error {
	conn, err := pgx.Connect(ctx, baseDSN)
	if err != nil {
		return fmt.Errorf("connect %s: %w", redactedDSN(baseDSN), err)
	}
	defer conn.Close(ctx)
	sql := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	if from != "" {
		sql += " TEMPLATE " + pgx.Identifier{from}.Sanitize()
	}
	if _, err := conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("create database %s: %w", name, err)
	}
	return nil
}

func dropDB(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, baseDSN)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	return err
}

// DSN returns a fresh, migrated database for this test, dropped at cleanup.
func DSN(t testing.TB) string {
	t.Helper()
	dsn, drop, err := FreshDSN()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() {
		if err := drop(); err != nil {
			t.Logf("testenv: %v", err)
		}
	})
	return dsn
}

// FreshDSN is DSN for code that has no testing.TB, such as an Example
// function: it returns a fresh, migrated database and the func that drops it.
func FreshDSN() (dsn string, drop func() error, err error) {
	name := "outboxd_t_" + randomHex(8)
	if err := createDB(context.Background(), name, template); err != nil {
		return "", nil, err
	}
	drop = func() error {
		if err := dropDB(context.Background(), name); err != nil {
			return fmt.Errorf("drop %s: %w", name, err)
		}
		return nil
	}
	return withDB(baseDSN, name), drop, nil
}

// Store opens a pool on a fresh database (see DSN), closed at cleanup.
func Store(t testing.TB) (*store.Store, string) {
	t.Helper()
	dsn := DSN(t)
	st, err := store.Open(context.Background(), dsn)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(st.Close)
	return st, dsn
}

// StoreAt migrates the database at dsn (a private server's) and opens a
// pool on it, closed at cleanup.
func StoreAt(t testing.TB, dsn string) *store.Store {
	t.Helper()
	ctx := context.Background()
	if _, err := migrations.Up(ctx, dsn, nil); err != nil {
		t.Fatalf("testenv: migrate: %v", err)
	}
	st, err := store.Open(ctx, dsn)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(st.Close)
	return st
}

// RedisAddr is the test Redis' host:port.
func RedisAddr() string { return redisAddr }

// Prefix returns a key prefix unique to this test.
func Prefix(t testing.TB) string {
	return "t:" + sanitize.ReplaceAllString(t.Name(), "_") + ":" + randomHex(4) + ":"
}

var sanitize = regexp.MustCompile(`[^A-Za-z0-9_]+`)

// Redis returns a client and a key prefix unique to this test; the prefix's
// keys are deleted and the client closed at cleanup. It never flushes.
func Redis(t testing.TB) (*redis.Client, string) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
	prefix := Prefix(t)
	t.Cleanup(func() {
		ctx := context.Background()
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		if len(keys) > 0 {
			c.Del(ctx, keys...)
		}
		_ = c.Close()
	})
	return c, prefix
}

func withDB(dsn, db string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		panic(err)
	}
	u.Path = "/" + db
	return u.String()
}

func redactedDSN(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return "(unparsable DSN)"
	}
	return u.Redacted()
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// EmptyDSN returns a fresh database with no schema (for "not migrated"
// paths), dropped at cleanup.
func EmptyDSN(t testing.TB) string {
	t.Helper()
	name := "outboxd_e_" + randomHex(8)
	if err := createDB(context.Background(), name, ""); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() { _ = dropDB(context.Background(), name) })
	return withDB(baseDSN, name)
}
