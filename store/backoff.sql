-- Rows backing off (pending, available_at past created_at: a failed
-- delivery's backoff, a replay, a producer's schedule) are found through
-- outbox_backoff_idx, and every statement that looks for them states the
-- condition in the words of that index's predicate (migration 00007), over
-- its own alias: one of the fragments below.
--
-- Guarantee: a query for rows backing off never walks outbox_pending_idx or
-- outbox_pending_aggregate_idx, whatever the statistics. Written as a plain
-- conjunction the condition implies those indexes' predicate (every pending
-- row), and once autovacuum has analyzed the table while little is
-- pending, the planner prices a walk of all of outbox_pending_idx below the
-- cursor (ids in heap order: "sequential") under the small index, and takes
-- it. Under a snapshot held elsewhere that index keeps an entry for every
-- row delivered since, and each read would walk them all. COALESCE(..., false)
-- means the same in a WHERE clause (a NULL is rejected like false; these
-- columns never give one) but is one expression the planner does not look
-- into: it proves the backoff index's predicate by equality and no other.
-- TestHotPathCostDoesNotGrowWithHistory fails without it.

-- fragment: backing_off
-- The condition over the table's own columns (no alias).
COALESCE(dispatched_at IS NULL AND dead_at IS NULL AND available_at > created_at, false)

-- fragment: backing_off_d
-- The condition over alias d.
COALESCE(d.dispatched_at IS NULL AND d.dead_at IS NULL AND d.available_at > d.created_at, false)

-- fragment: backing_off_e
-- The condition over alias e.
COALESCE(e.dispatched_at IS NULL AND e.dead_at IS NULL AND e.available_at > e.created_at, false)
