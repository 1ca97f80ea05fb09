-- +goose Up
-- outbox_idempotency without the index on expires_at, and with half of
-- each page left free: a batch turns each claim it wrote into a delivered
-- mark (a new expires_at), and with no index on the columns it changes
-- and room on the row's own page that update is a HOT update, which
-- writes no index entry. Retention finds the expired keys by walking the
-- primary key in outbox_id order instead (idempotency_purge): the ids
-- follow the order the events were written, so the oldest keys come first.
DROP INDEX outbox_idempotency_expires_idx;
ALTER TABLE outbox_idempotency SET (fillfactor = 50);

-- +goose Down
ALTER TABLE outbox_idempotency RESET (fillfactor);
CREATE INDEX outbox_idempotency_expires_idx ON outbox_idempotency (expires_at);
