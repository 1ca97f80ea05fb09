-- +goose Up
-- The idempotency keys of idempotency.store: postgres, one row per key:
-- what Redis holds at idempotency:notify:<outbox_id> otherwise, with the
-- same values (a claim "claim:<token>:<owner>:<batch>" or a delivered mark
-- "1:<fingerprint>"). A row is live while expires_at is ahead of
-- Postgres' now(); an expired row counts as absent and retention deletes
-- it. No foreign key to outbox: a mark outlives its row's purge, as a
-- Redis key does.
CREATE TABLE outbox_idempotency (
    outbox_id  bigint      PRIMARY KEY,
    value      text        NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX outbox_idempotency_expires_idx ON outbox_idempotency (expires_at);

-- +goose Down
DROP TABLE outbox_idempotency;
