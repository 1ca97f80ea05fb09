-- +goose NO TRANSACTION
-- +goose Up
-- `outboxd dead list` and /dead page newest first by (dead_at, id) with a
-- keyset cursor. outbox_dead_idx (dead_at) alone makes a page read and sort
-- every row of the dead_at it stops in (a batch dead-lettered together
-- shares one; an operator's UPDATE can give 100k rows the same), and while
-- it exists the planner prefers it for the list. The new index serves the
-- purge of dead rows (reconcile.dead_retention) as well, so it replaces it.
-- CONCURRENTLY: producers keep inserting meanwhile. It runs outside a
-- transaction, so an interrupted build can leave an invalid index behind,
-- dropped by the first statement of the next attempt.
DROP INDEX CONCURRENTLY IF EXISTS outbox_dead_list_idx;
CREATE INDEX CONCURRENTLY outbox_dead_list_idx ON outbox (dead_at, id) WHERE dead_at IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS outbox_dead_idx;

-- +goose Down
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_dead_idx ON outbox (dead_at) WHERE dead_at IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS outbox_dead_list_idx;
