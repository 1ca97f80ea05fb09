-- The backlog as operators see it, and the floors the counts start from
-- before a poller saved a cursor.

-- name: stats
-- Pending rows, the oldest pending row's age in seconds, dead rows
-- (Store.Stats). Run with sorts off (statsSettings).
--
-- It counts from the poller's saved cursor (outbox_cursor, this epoch, the
-- row written last: saved_cursor in cursor.sql) on: at or below it every
-- row is delivered, dead or backing off. With none saved yet, from @floor,
-- Store.SweepFloor's floor, which has the same property. From id 0 each
-- scrape would walk the entry of every row delivered while a snapshot is
-- held elsewhere (vacuum cannot remove them), growing without bound. Rows
-- an operator makes pending again below the cursor count once the
-- poller's rescan has found them (poller.rescanEvery) and saved a cursor
-- below them.
--
-- Above the cursor it is one walk of outbox_pending_idx from the cursor
-- on, reading the index alone: its entries of pending rows, and of rows
-- delivered since the save (at most saveEvery's worth), whose heap row is
-- looked at once, the entry then marked dead for later scrapes (under a
-- snapshot held elsewhere, looked at by each scrape). A walk of the
-- primary key instead, the pending conditions as FILTERs, would read every
-- row above the cursor in the heap, old and new versions, which a drain
-- scatters. The walk is asked for in id order (ORDER BY id in a subquery,
-- which keeps it) and planned with sorts off: outbox_pending_aggregate_idx
-- has the same predicate and holds id too, and a plan made when ANALYZE
-- saw nothing pending reads it whole (every entry a held snapshot keeps)
-- and sorts, priced below the walk from the cursor by its leading
-- column's correlation; without a sort, only outbox_pending_idx gives the
-- order (TestHotPathCostDoesNotGrowWithHistory,
-- TestBacklogCountReadsThePendingIndexAlone). Below the cursor, the rows
-- backing off through outbox_backoff_idx, alone behind OFFSET 0 (with the
-- id range beside it the planner walks the primary key instead); the
-- lowest of them likewise, so that min(id) is not planned as a walk of an
-- index from its start.
--   @floor  bigint  the floor without a saved cursor (NULL: one is saved)
WITH c AS MATERIALIZED (
  SELECT COALESCE({{saved_cursor}}, @floor::bigint) AS lo),
above AS MATERIALIZED (
  SELECT count(*) AS pending, min(id) AS first FROM (
    SELECT id FROM outbox WHERE dispatched_at IS NULL AND dead_at IS NULL AND id > (SELECT lo FROM c)
    ORDER BY id) p),
delayed AS MATERIALIZED (
  SELECT id FROM outbox WHERE {{backing_off}} OFFSET 0)
SELECT
  above.pending + (SELECT count(*) FROM delayed WHERE id <= (SELECT lo FROM c)),
  COALESCE((SELECT extract(epoch FROM now() - created_at)::float8 FROM outbox WHERE id = LEAST(
    (SELECT min(id) FROM delayed), above.first)), 0),
  (SELECT count(*) FROM outbox WHERE dead_at IS NOT NULL)
FROM above

-- name: cursor_saved
-- Whether a poller saved a cursor in this epoch (Store.SweepFloor).
SELECT EXISTS (SELECT 1 FROM outbox_cursor WHERE epoch = {{epoch}})

-- name: pending_floor
-- The id before the lowest pending row not backing off (NULL: none), by a
-- walk of outbox_pending_idx in id order that stops at the first such row.
-- Run with sorts off (floorSettings): see Store.pendingFloor. ORDER BY id
-- LIMIT 1, not min(id): with few rows in its estimates the planner
-- computes min(id) from a whole index read in any order, every entry of
-- the history included
-- (TestFirstStartCostsNoMoreThanOneWalkOfThePendingIndex).
SELECT (SELECT id FROM outbox
  WHERE dispatched_at IS NULL AND dead_at IS NULL AND available_at <= created_at
  ORDER BY id LIMIT 1) - 1

-- name: load_floor
-- The id before the lowest pending row (NULL: none), as pending_floor.
SELECT (SELECT id FROM outbox WHERE dispatched_at IS NULL AND dead_at IS NULL
  ORDER BY id LIMIT 1) - 1
