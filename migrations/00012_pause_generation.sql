-- +goose Up
-- The pause generation (one row): every `outboxd pause` and `outboxd
-- resume` raises generation in the statement that changes
-- outbox_paused_destinations (fenced under lock:reconciliation); the leader
-- reads both in one statement and, once it holds back the paused
-- destinations' sends, records the generation it applied in applied
-- (fenced under lock:outbox:poller: applied_token is its token, applied_at
-- Postgres' now()). The command waits until applied reaches its generation.
CREATE TABLE outbox_pause_generation (
    one           bool        PRIMARY KEY DEFAULT true CHECK (one),
    generation    bigint      NOT NULL DEFAULT 0,
    applied       bigint      NOT NULL DEFAULT 0,
    applied_token bigint,
    applied_at    timestamptz
);

-- +goose Down
DROP TABLE outbox_pause_generation;
