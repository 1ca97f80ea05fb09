-- +goose Up
-- The cold pass the cursor's holder still owes: a cursor computed at a
-- term's start (no saved one) is right for every row visible then, and a
-- producer in flight at that moment can still commit a row below it. The
-- holder rescans below the cursor once every transaction of that snapshot
-- ended (xmin reaches this horizon, the snapshot's xmax). Saved with the
-- cursor so that a successor taking over before that pass completed owes
-- it too; 0: none owed. A constant default: no table rewrite.
ALTER TABLE outbox_cursor ADD COLUMN horizon bigint NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE outbox_cursor DROP COLUMN horizon;
