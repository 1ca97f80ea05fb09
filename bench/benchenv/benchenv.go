// Package benchenv gives each benchmark run its own database and Redis key
// prefix on the shared servers, and removes them afterwards.
package benchenv

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// FreshDB creates an empty database beside the one baseDSN names and
// returns its DSN and a func that drops it.
func FreshDB(ctx context.Context, baseDSN string) (string, func(), error) {
	name := fmt.Sprintf("outboxd_bench_%d", time.Now().UnixNano())
	admin, err := pgx.Connect(ctx, baseDSN)
	if err != nil {
		return "", nil, err
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		_ = admin.Close(ctx)
		return "", nil, err
	}
	cfg := admin.Config()
	dsn := fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", cfg.User, cfg.Host, cfg.Port, name)
	return dsn, func() {
		_, _ = admin.Exec(context.WithoutCancel(ctx), "DROP DATABASE "+name+" WITH (FORCE)")
		_ = admin.Close(context.WithoutCancel(ctx))
	}, nil
}

// Prefix returns a key prefix no other run uses.
func Prefix(name string) string { return fmt.Sprintf("%s:%d:", name, time.Now().UnixNano()) }

// CleanKeys deletes every key under prefix.
func CleanKeys(rdb *redis.Client, prefix string) {
	ctx := context.Background()
	iter := rdb.Scan(ctx, 0, prefix+"*", 5000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		if keys = append(keys, iter.Val()); len(keys) == 5000 {
			rdb.Unlink(ctx, keys...)
			keys = keys[:0]
		}
	}
	if len(keys) > 0 {
		rdb.Unlink(ctx, keys...)
	}
}

// PostgresDSN is the maintenance DSN databases are created beside
// (OUTBOXD_TEST_POSTGRES_DSN, as for the tests).
func PostgresDSN() string {
	return cmp.Or(os.Getenv("OUTBOXD_TEST_POSTGRES_DSN"), "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable")
}

// RedisAddr is the Redis server (OUTBOXD_TEST_REDIS_ADDR, as for the tests).
func RedisAddr() string { return cmp.Or(os.Getenv("OUTBOXD_TEST_REDIS_ADDR"), "127.0.0.1:6379") }

// NATSURL is the NATS server, JetStream on (OUTBOXD_TEST_NATS_URL, as for
// the tests).
func NATSURL() string { return cmp.Or(os.Getenv("OUTBOXD_TEST_NATS_URL"), "nats://127.0.0.1:4222") }

// RabbitMQURL is the RabbitMQ broker (OUTBOXD_TEST_RABBITMQ_URL, as for the
// tests).
func RabbitMQURL() string {
	return cmp.Or(os.Getenv("OUTBOXD_TEST_RABBITMQ_URL"), "amqp://guest:guest@127.0.0.1:5672/")
}
