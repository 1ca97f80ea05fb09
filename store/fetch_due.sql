-- name: fetch_due
-- Due rows in id order, stateless (from id 0, no cursor): the form the
-- store's tests compare Read with. Every row of an aggregate that has an
-- earlier undelivered row still backing off is skipped, so per-aggregate
-- order is never broken. Dead rows do not block their aggregate. Rows in
-- @skip are left out, and every row of the aggregates (@busy_types,
-- @busy_ids), both as NOT IN (hashed subplans). Of those candidates (@rows
-- at most) it returns the prefix whose loaded bytes stay within @bytes
-- (always the first row). A row above @row_bytes is returned without
-- payload and headers (and with its text columns cut).
--   @rows        int       rows, at most
--   @row_bytes   bigint    a larger row comes back unloaded
--   @bytes       bigint    the batch's byte budget
--   @skip        bigint[]  ids not to return
--   @busy_types  text[]    aggregates not to return: types
--   @busy_ids    text[]    their ids
SELECT id,
  CASE WHEN size <= @row_bytes THEN aggregate_type ELSE left(aggregate_type, 200) END,
  CASE WHEN size <= @row_bytes THEN aggregate_id ELSE left(aggregate_id, 200) END,
  CASE WHEN size <= @row_bytes THEN event_type ELSE left(event_type, 200) END,
  CASE WHEN size <= @row_bytes THEN payload END, CASE WHEN size <= @row_bytes THEN headers END,
  created_at, attempts, size
FROM (
  SELECT d.*, sum(CASE WHEN d.size <= @row_bytes THEN d.size::int4 ELSE 0 END) OVER w AS loaded, row_number() OVER w AS n
  FROM (
    SELECT o.id, o.aggregate_type, o.aggregate_id, o.event_type, o.payload, o.headers, o.created_at, o.attempts,
      {{row_size}} AS size
    FROM outbox o
    WHERE o.dispatched_at IS NULL AND o.dead_at IS NULL AND o.available_at <= now()
      AND o.id NOT IN (SELECT unnest(@skip::bigint[])) -- a hashed subplan
      AND (o.aggregate_type, o.aggregate_id) NOT IN (SELECT b.t, b.a FROM unnest(@busy_types::text[], @busy_ids::text[]) b(t, a))
      AND NOT EXISTS (
        SELECT 1 FROM outbox e
        WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id
          AND e.id < o.id AND {{backing_off_e}} AND e.available_at > now())
    ORDER BY o.id
    LIMIT @rows) d
  WINDOW w AS (ORDER BY d.id ROWS UNBOUNDED PRECEDING)
) x
WHERE n = 1 OR loaded <= @bytes
ORDER BY id
