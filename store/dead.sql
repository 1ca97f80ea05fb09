-- Dead-lettered rows for operators: list, count, show, replay, discard.
--
-- The filter (DeadFilter) is written into a statement where it says
-- /* filter */, as " AND " and the conditions set, each a dead_if_*
-- fragment below: only the conditions set are written, since under
-- force_generic_plan (see OpenConfig) a catch-all form (@x IS NULL OR
-- column = @x) would get one plan for every shape, and a bad one for most.
-- Each statement's header lists every parameter a filter can bring.

-- fragment: dead_if_ids
id = ANY(@ids::bigint[])
-- fragment: dead_if_aggregate_type
aggregate_type = @aggregate_type
-- fragment: dead_if_aggregate_id
aggregate_id = @aggregate_id
-- fragment: dead_if_event_like
event_type LIKE @event_type ESCAPE '\'
-- fragment: dead_if_event_type
event_type = @event_type
-- fragment: dead_if_since
dead_at >= @since
-- fragment: dead_if_until
dead_at < @until
-- fragment: dead_if_since_ago
dead_at >= now() - @since_ago_us::bigint * interval '1 microsecond'
-- fragment: dead_if_until_ago
dead_at < now() - @until_ago_us::bigint * interval '1 microsecond'
-- fragment: dead_if_error
strpos(lower(last_error), lower(@error)) > 0

-- fragment: dead_columns
id, aggregate_type, aggregate_id, event_type, attempts, COALESCE(last_error, ''),
  created_at, available_at, dead_at

-- fragment: dead_picked
-- The CTE "picked" of a fenced batch over dead rows (dead_replay,
-- dead_discard): the next batch of the filter's dead rows after the cursor
-- (@after_at, @after_id), at most @batch, oldest first along
-- outbox_dead_list_idx, locked (SKIP LOCKED: a row another replay, discard
-- or purge holds is left to it), picked only under the fence.
picked AS (
  SELECT id, dead_at FROM outbox
  WHERE dead_at IS NOT NULL /* filter */ AND (dead_at, id) > (@after_at::timestamptz, @after_id::bigint) AND EXISTS (SELECT 1 FROM fence)
  ORDER BY dead_at, id LIMIT @batch
  FOR UPDATE SKIP LOCKED)

-- name: dead_list
-- A page of the list, newest first: dead_columns. It walks
-- outbox_dead_list_idx (dead_at, id) backwards from the cursor, so a page
-- reads its own rows (and the ones the filter drops), never the pages
-- before it. dead_list_after is the same from a cursor.
--   @limit  int  rows, at most
--   @ids, @aggregate_type, @aggregate_id, @event_type, @since, @until  the filter
--   @since_ago_us, @until_ago_us, @error  the filter
SELECT {{dead_columns}} FROM outbox WHERE dead_at IS NOT NULL /* filter */
ORDER BY dead_at DESC, id DESC LIMIT @limit

-- name: dead_list_after
-- dead_list after the cursor (@before_at, @before_id).
--   @limit  int  rows, at most
--   @ids, @aggregate_type, @aggregate_id, @event_type, @since, @until  the filter
--   @since_ago_us, @until_ago_us, @error  the filter
--   @before_at  timestamptz  the cursor's dead_at
--   @before_id  bigint       the cursor's id
SELECT {{dead_columns}} FROM outbox WHERE dead_at IS NOT NULL /* filter */ AND (dead_at, id) < (@before_at::timestamptz, @before_id::bigint)
ORDER BY dead_at DESC, id DESC LIMIT @limit

-- name: dead_count
-- How many dead rows the filter selects (what a replay would requeue).
--   @ids, @aggregate_type, @aggregate_id, @event_type, @since, @until  the filter
--   @since_ago_us, @until_ago_us, @error  the filter
SELECT count(*) FROM outbox WHERE dead_at IS NOT NULL /* filter */

-- name: dead_show
-- One row by id with its payload and headers, dead or not (Store.ShowDead
-- says which): dead_columns, payload, headers, dispatched_at.
--   @id  bigint  the row
SELECT {{dead_columns}}, payload, headers, dispatched_at FROM outbox WHERE id = @id

-- name: dead_replay
-- Requeues the next batch of the filter's dead rows (dead_picked) as one
-- fenced statement. The UPDATE re-checks dead_at, so a row that stopped
-- being dead meanwhile is not touched. The attempt history stays: marked
-- adds an entry of kind "replay" after the row's last, and the failures
-- after the replay are numbered after it (complete.sql). Returns the fence's outcome, how
-- many rows it requeued and the last of them (dead_at, id) as the next
-- cursor.
--   @lock, @token, @owner  the fence (fence.sql)
--   @after_at  timestamptz  the cursor's dead_at
--   @after_id  bigint       the cursor's id
--   @batch     int          rows, at most
--   @ids, @aggregate_type, @aggregate_id, @event_type, @since, @until  the filter
--   @since_ago_us, @until_ago_us, @error  the filter
{{fence}},
{{dead_picked}},
requeued AS (
  UPDATE outbox o SET dead_at = NULL, attempts = 0, available_at = now()
  FROM picked WHERE o.id = picked.id AND o.dead_at IS NOT NULL AND EXISTS (SELECT 1 FROM fence)
  RETURNING o.id, o.created_at, picked.dead_at),
marked AS (
  INSERT INTO outbox_attempts (outbox_id, attempt, created_at, kind, excerpt, fencing_token)
  SELECT r.id, COALESCE((SELECT max(a.attempt) FROM outbox_attempts a WHERE a.outbox_id = r.id AND a.created_at = r.created_at), 0) + 1,
    r.created_at, 'replay', 'requeued by replay', @token::bigint
  FROM requeued r
  ON CONFLICT (outbox_id, attempt) DO UPDATE SET created_at = EXCLUDED.created_at, at = now(), kind = EXCLUDED.kind,
    excerpt = EXCLUDED.excerpt, duration_ms = NULL, fencing_token = EXCLUDED.fencing_token
  RETURNING 1),
last AS (SELECT dead_at, id FROM requeued ORDER BY dead_at DESC, id DESC LIMIT 1)
SELECT EXISTS (SELECT 1 FROM fence), (SELECT count(*) FROM requeued),
  (SELECT dead_at FROM last), COALESCE((SELECT id FROM last), 0), (SELECT count(*) FROM marked)

-- name: dead_discard
-- Deletes the next batch of the filter's dead rows (dead_picked) as one
-- fenced statement; the DELETE re-checks dead_at, so a row requeued
-- meanwhile is not touched, and the deleted rows' attempt history goes
-- with them. Returns the fence's outcome, how many rows it deleted, the
-- last of them (dead_at, id) as the next cursor, and the deleted rows as a
-- JSON array in (dead_at, id) order.
--   @lock, @token, @owner  the fence (fence.sql)
--   @after_at  timestamptz  the cursor's dead_at
--   @after_id  bigint       the cursor's id
--   @batch     int          rows, at most
--   @ids, @aggregate_type, @aggregate_id, @event_type, @since, @until  the filter
--   @since_ago_us, @until_ago_us, @error  the filter
{{fence}},
{{dead_picked}},
removed AS (
  DELETE FROM outbox o USING picked
  WHERE o.id = picked.id AND o.dead_at IS NOT NULL AND EXISTS (SELECT 1 FROM fence)
  RETURNING o.id, o.aggregate_type, o.aggregate_id, o.event_type, picked.dead_at),
history AS (DELETE FROM outbox_attempts a WHERE a.outbox_id IN (SELECT id FROM removed)),
last AS (SELECT dead_at, id FROM removed ORDER BY dead_at DESC, id DESC LIMIT 1)
SELECT EXISTS (SELECT 1 FROM fence), (SELECT count(*) FROM removed),
  (SELECT dead_at FROM last), COALESCE((SELECT id FROM last), 0),
  COALESCE((SELECT json_agg(json_build_object('id', id, 'aggregate_type', aggregate_type,
    'aggregate_id', aggregate_id, 'event_type', event_type) ORDER BY dead_at, id) FROM removed), '[]')
