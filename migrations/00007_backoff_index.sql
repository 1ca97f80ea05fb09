-- +goose NO TRANSACTION
-- +goose Up
-- Rows backing off, as outbox_delayed_idx held them, under a predicate
-- written so that only the queries that name it can use it (store's
-- backingOff, in store/backoff.go, is the same text). Why: a query for backing-off rows also satisfies the
-- predicate of outbox_pending_idx (every pending row), and once autovacuum
-- has analyzed the table (few rows pending, ids in heap order) the planner
-- priced a walk of that whole index as cheap as this small one, and took
-- it. Under a snapshot held elsewhere that index keeps an entry for every
-- row delivered since, and each read walked them all. Wrapped in COALESCE(..., false), the
-- same condition (a qual treats NULL as false; these columns never give
-- NULL) is one opaque expression: the planner cannot prove the pending
-- indexes' predicates from it, so they are not candidates whatever the
-- statistics, and it proves this index's by equality.
-- CONCURRENTLY: producers keep inserting meanwhile; the old index goes
-- once the new one is valid (an interrupted build leaves an invalid index,
-- dropped by the next attempt's first statement).
DROP INDEX CONCURRENTLY IF EXISTS outbox_backoff_idx;
CREATE INDEX CONCURRENTLY outbox_backoff_idx ON outbox (aggregate_type, aggregate_id, id)
    WHERE COALESCE(dispatched_at IS NULL AND dead_at IS NULL AND available_at > created_at, false);
DROP INDEX CONCURRENTLY IF EXISTS outbox_delayed_idx;

-- +goose Down
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_delayed_idx ON outbox (aggregate_type, aggregate_id, id)
    WHERE dispatched_at IS NULL AND dead_at IS NULL AND available_at > created_at;
DROP INDEX CONCURRENTLY IF EXISTS outbox_backoff_idx;
