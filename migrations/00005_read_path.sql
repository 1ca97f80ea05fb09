-- +goose Up
-- The read path (see README, "How it works"): each row records the
-- transaction that wrote it, so a late commit can be named. Added nullable
-- first and given its default in a second statement: a volatile default in
-- ADD COLUMN would rewrite the whole table under an exclusive lock. Rows
-- written before this migration keep NULL.
ALTER TABLE outbox ADD COLUMN txid xid8;
ALTER TABLE outbox ALTER COLUMN txid SET DEFAULT pg_current_xact_id();

-- Where the poller's scan starts: every id at or below cursor is delivered,
-- dead, backing off (outbox_delayed_idx), or was still tracked by the
-- holder that wrote it (its parked aggregates and watched gaps are folded
-- in, so the value is conservative). Written fenced, like every poller
-- write, so a paused ex-holder cannot move it. epoch names the table's and
-- its id sequence's storage when the cursor was saved: TRUNCATE or an id
-- RESTART gives them new storage, and a cursor of the old ids is not used.
CREATE TABLE outbox_cursor (
    lock_name  text        PRIMARY KEY,
    cursor     bigint      NOT NULL,
    epoch      text        NOT NULL DEFAULT '',
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE outbox_cursor;
ALTER TABLE outbox DROP COLUMN txid;
