-- +goose Up
-- The leases of lock.backend: postgres (package lock/pglease), one row per
-- lock. A lease is held while expires_at is ahead of Postgres' now():
-- Postgres' clock judges it, so a holder that stops renewing loses it
-- within its TTL. token is the lock's fencing-token counter: a released or
-- expired lease keeps its row and its token, and each acquisition takes
-- greatest(token, floor, outbox_fence's token) + 1. owner is NULL once
-- released.
CREATE TABLE outbox_leases (
    lock_name  text        PRIMARY KEY,
    owner      text,
    instance   text,
    token      bigint      NOT NULL,
    expires_at timestamptz NOT NULL
);

-- +goose Down
DROP TABLE outbox_leases;
