package peer

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// bareLock is the fence row the bare protocol writes under, as outboxd's
// poller does.
const bareLock = "lock:outbox:poller"

// bareFetch reads the next batch of due rows above the cursor, in id
// order, with what a sink would be given.
const bareFetch = `SELECT id, payload::text, headers::text FROM outbox
WHERE dispatched_at IS NULL AND dead_at IS NULL AND available_at <= now() AND id > @cursor
ORDER BY id LIMIT @batch`

// bareMark is the fenced write: lock the lock's outbox_fence row, compare
// the token, mark the batch's ids dispatched; asynchronous commit for this
// transaction only, as outboxd's own write does.
const bareMark = `WITH f AS MATERIALIZED (
  SELECT token FROM outbox_fence WHERE lock_name = @lock FOR UPDATE),
async AS (SELECT set_config('synchronous_commit', 'off', true)),
u AS (
  UPDATE outbox SET dispatched_at = now()
  WHERE id = ANY(@ids::bigint[]) AND dispatched_at IS NULL AND EXISTS (SELECT 1 FROM f WHERE f.token = @token)
  RETURNING 1)
SELECT EXISTS (SELECT 1 FROM f WHERE f.token = @token), (SELECT count(*) FROM u) FROM async`

// BareDrain is the delivery protocol alone, with no sink, no ordering
// beyond id order and no pipelining: until n rows are marked, it fetches
// the due rows of the outbox table at pool in id order (batch at a time),
// claims their idempotency keys under prefix in one Redis pipeline
// (SET NX PX 60 s), sets their delivered marks in another (SET 1:<sha-256
// of payload and headers> PX 24 h), and marks them dispatched in one fenced
// UPDATE. It returns how long that took, from its first fetch: the ceiling
// the relay is measured against, as watermill's forwarder is the peer.
func BareDrain(ctx context.Context, pool *pgxpool.Pool, rdb *redis.Client, prefix string, batch, n int) (time.Duration, error) {
	const token = 1
	if _, err := pool.Exec(ctx, `INSERT INTO outbox_fence (lock_name, token) VALUES (@lock, @token)
		ON CONFLICT (lock_name) DO UPDATE SET token = EXCLUDED.token`, pgx.NamedArgs{"lock": bareLock, "token": token}); err != nil {
		return 0, fmt.Errorf("bare: fence row: %w", err)
	}
	claim := "claim:" + strconv.Itoa(token) + ":bare:1"
	start := time.Now()
	var cursor int64
	for done := 0; done < n; {
		ids, marks, err := bareBatch(ctx, pool, cursor, batch)
		if err != nil {
			return 0, err
		}
		if len(ids) == 0 {
			return 0, fmt.Errorf("bare: %d rows marked, no more due", done)
		}
		cursor = ids[len(ids)-1]
		if err := bareKeys(ctx, rdb, prefix, ids, marks, claim); err != nil {
			return 0, err
		}
		var ok bool
		var marked int64
		if err := pool.QueryRow(ctx, bareMark, pgx.NamedArgs{"lock": bareLock, "token": token, "ids": ids}).Scan(&ok, &marked); err != nil {
			return 0, fmt.Errorf("bare: mark: %w", err)
		}
		if !ok {
			return 0, fmt.Errorf("bare: fence refused token %d", token)
		}
		done += int(marked)
	}
	return time.Since(start), nil
}

// bareBatch fetches up to batch due rows above cursor: their ids and
// delivered marks.
func bareBatch(ctx context.Context, pool *pgxpool.Pool, cursor int64, batch int) (ids []int64, marks []string, err error) {
	rows, err := pool.Query(ctx, bareFetch, pgx.NamedArgs{"cursor": cursor, "batch": batch})
	if err != nil {
		return nil, nil, fmt.Errorf("bare: fetch: %w", err)
	}
	var id int64
	var payload, headers []byte
	_, err = pgx.ForEachRow(rows, []any{&id, &payload, &headers}, func() error {
		h := sha256.New()
		h.Write(payload)
		h.Write(headers)
		ids, marks = append(ids, id), append(marks, "1:"+hex.EncodeToString(h.Sum(nil)[:8]))
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("bare: fetch: %w", err)
	}
	return ids, marks, nil
}

// bareKeys claims the batch's keys in one pipeline, then sets their
// delivered marks in another.
func bareKeys(ctx context.Context, rdb *redis.Client, prefix string, ids []int64, marks []string, claim string) error {
	names := make([]string, len(ids))
	for i, id := range ids {
		names[i] = prefix + "idempotency:notify:" + strconv.FormatInt(id, 10)
	}
	pipe := rdb.Pipeline()
	for _, k := range names {
		pipe.SetNX(ctx, k, claim, time.Minute)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("bare: claims: %w", err)
	}
	pipe = rdb.Pipeline()
	for i, k := range names {
		pipe.Set(ctx, k, marks[i], 24*time.Hour)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("bare: marks: %w", err)
	}
	return nil
}
