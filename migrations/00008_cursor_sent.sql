-- +goose Up
-- The highest id the cursor's holder (and the holders before it) handed on
-- to a sink: a new holder checks rows it reads at or below it, above the
-- cursor, for a later row of their aggregate already dispatched (a late
-- commit across a change of holder, see poller/readpath.go). A constant
-- default: no table rewrite. 0 (a cursor saved before this migration) is
-- read as unknown, and the new holder uses the table's highest id instead.
ALTER TABLE outbox_cursor ADD COLUMN sent bigint NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE outbox_cursor DROP COLUMN sent;
