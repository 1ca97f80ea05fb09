-- Resend: delivered rows sent again as new pending rows (Store.Resend).
--
-- The filter (ResendFilter) is written where a statement says /* filter */,
-- as " AND " and the resend_if_* fragments set, as dead.sql does.

-- fragment: resend_if_ids
o.id = ANY(@ids::bigint[])
-- fragment: resend_if_from_id
o.id >= @from_id::bigint
-- fragment: resend_if_to_id
o.id <= @to_id::bigint
-- fragment: resend_if_aggregate_type
o.aggregate_type = @aggregate_type
-- fragment: resend_if_aggregate_id
o.aggregate_id = @aggregate_id
-- fragment: resend_if_event_like
o.event_type LIKE @event_type ESCAPE '\'
-- fragment: resend_if_event_type
o.event_type = @event_type
-- fragment: resend_if_created_since
o.created_at >= @since
-- fragment: resend_if_created_until
o.created_at < @until
-- fragment: resend_if_created_since_ago
o.created_at >= now() - @since_ago_us::bigint * interval '1 microsecond'
-- fragment: resend_if_created_until_ago
o.created_at < now() - @until_ago_us::bigint * interval '1 microsecond'
-- fragment: resend_if_dispatched_since
o.dispatched_at >= @since
-- fragment: resend_if_dispatched_until
o.dispatched_at < @until
-- fragment: resend_if_dispatched_since_ago
o.dispatched_at >= now() - @since_ago_us::bigint * interval '1 microsecond'
-- fragment: resend_if_dispatched_until_ago
o.dispatched_at < now() - @until_ago_us::bigint * interval '1 microsecond'
-- fragment: resend_if_kinds
(o.aggregate_type, o.event_type) IN
  (SELECT k.a, k.e FROM unnest(@kind_aggregate_types::text[], @kind_event_types::text[]) AS k(a, e))
-- fragment: resend_if_error
EXISTS (SELECT 1 FROM outbox_attempts a WHERE a.outbox_id = o.id AND a.created_at = o.created_at
  AND strpos(lower(a.excerpt), lower(@error)) > 0)

-- name: resend_count
-- How many delivered rows the filter selects (what a resend would copy).
--   @ids, @from_id, @to_id, @aggregate_type, @aggregate_id, @event_type  the filter
--   @since, @until, @since_ago_us, @until_ago_us, @error  the filter
--   @kind_aggregate_types, @kind_event_types  the filter: only these pairs
SELECT count(*) FROM outbox o WHERE o.dispatched_at IS NOT NULL /* filter */

-- name: resend_kinds
-- The distinct (aggregate_type, event_type) pairs of the delivered rows
-- the filter selects: what a resend to one destination maps through the
-- routes to choose its rows.
--   @ids, @from_id, @to_id, @aggregate_type, @aggregate_id, @event_type  the filter
--   @since, @until, @since_ago_us, @until_ago_us, @error  the filter
--   @kind_aggregate_types, @kind_event_types  the filter: only these pairs
SELECT DISTINCT o.aggregate_type, o.event_type FROM outbox o WHERE o.dispatched_at IS NOT NULL /* filter */
ORDER BY 1, 2

-- name: resend_missing
-- Which of the ids asked for have no row at all (purged past retention,
-- discarded, or never written).
--   @ids  bigint[]  the ids asked for
SELECT x.id FROM unnest(@ids::bigint[]) AS x(id)
WHERE NOT EXISTS (SELECT 1 FROM outbox o WHERE o.id = x.id) ORDER BY x.id

-- name: resend
-- Copies the next batch of the filter's delivered rows (after @after_id,
-- oldest first, at most @batch) as new pending rows, as one fenced
-- statement. A copy is an ordinary row with its own id, behind every row
-- already written, so it never overtakes a pending row of its aggregate
-- and later rows queue behind it; the copies of one batch are numbered in
-- the originals' order. Its headers are the original's plus
-- "outbox-resent-from" (the original's id). The attempt history of both
-- records the resend: the original's next entry, the copy's entry 0, each
-- of kind "resend". Returns the fence's outcome, how many rows it copied,
-- the last original id, and the pairs (original, copy) as a JSON array in
-- the originals' order.
--   @lock, @token, @owner  the fence (fence.sql)
--   @after_id  bigint  the cursor: the last original id of the batch before
--   @batch     int     rows, at most
--   @ids, @from_id, @to_id, @aggregate_type, @aggregate_id, @event_type  the filter
--   @since, @until, @since_ago_us, @until_ago_us, @error  the filter
--   @kind_aggregate_types, @kind_event_types  the filter: only these pairs
{{fence}},
picked AS (
  SELECT o.id, o.aggregate_type, o.aggregate_id, o.event_type, o.payload, o.headers, o.created_at, o.attempts FROM outbox o
  WHERE o.dispatched_at IS NOT NULL /* filter */ AND o.id > @after_id::bigint AND EXISTS (SELECT 1 FROM fence)
  ORDER BY o.id LIMIT @batch
  FOR KEY SHARE),
copies AS (
  INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
  SELECT p.aggregate_type, p.aggregate_id, p.event_type, p.payload,
    CASE WHEN jsonb_typeof(p.headers) = 'object' THEN p.headers ELSE '{}'::jsonb END
      || jsonb_build_object('outbox-resent-from', p.id::text)
  FROM (SELECT * FROM picked ORDER BY id) p
  RETURNING id, created_at, (headers->>'outbox-resent-from')::bigint AS original),
marked AS (
  INSERT INTO outbox_attempts (outbox_id, attempt, created_at, kind, excerpt, fencing_token)
  SELECT p.id, GREATEST(p.attempts, COALESCE((SELECT max(a.attempt) FROM outbox_attempts a WHERE a.outbox_id = p.id), 0)) + 1,
    p.created_at, 'resend', 'resent as ' || c.id, @token::bigint
  FROM picked p JOIN copies c ON c.original = p.id
  UNION ALL
  SELECT c.id, 0, c.created_at, 'resend', 'copy of ' || c.original, @token::bigint FROM copies c
  ON CONFLICT (outbox_id, attempt) DO UPDATE SET created_at = EXCLUDED.created_at, at = now(), kind = EXCLUDED.kind,
    excerpt = EXCLUDED.excerpt, duration_ms = NULL, fencing_token = EXCLUDED.fencing_token
  RETURNING 1)
SELECT EXISTS (SELECT 1 FROM fence), (SELECT count(*) FROM copies),
  COALESCE((SELECT max(id) FROM picked), 0),
  COALESCE((SELECT json_agg(json_build_object('id', original, 'copy', id) ORDER BY original) FROM copies), '[]'),
  (SELECT count(*) FROM marked)
