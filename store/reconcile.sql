-- The reconciler's statements: its runs, the repair sweep, the retention
-- purge and the attempts histogram.

-- name: begin_run
-- Records that @fire_time is being reconciled, fenced. Returns the
-- fence's outcome and 1, or 0 when that fire time already ran.
--   @lock, @token, @owner  the fence (fence.sql)
--   @fire_time  timestamptz  the cron fire time
{{fence}},
run AS (
  INSERT INTO reconcile_runs (fire_time, token)
  SELECT @fire_time, @token WHERE EXISTS (SELECT 1 FROM fence)
  ON CONFLICT (fire_time) DO NOTHING
  RETURNING 1)
SELECT EXISTS (SELECT 1 FROM fence), (SELECT count(*) FROM run)

-- name: finish_run
-- Stores a run's summary, fenced. The summary goes as JSON text cast in
-- the statement: the same in every query exec mode a postgres.dsn can
-- choose (bytes go as bytea in the exec and simple_protocol modes, which
-- jsonb refuses).
--   @lock, @token, @owner  the fence (fence.sql)
--   @fire_time  timestamptz  the cron fire time
--   @summary    text         the summary as JSON
{{fence}},
run AS (
  UPDATE reconcile_runs SET finished_at = now(), summary = @summary::jsonb
  WHERE fire_time = @fire_time AND EXISTS (SELECT 1 FROM fence)
  RETURNING 1)
SELECT EXISTS (SELECT 1 FROM fence), (SELECT count(*) FROM run)

-- name: run_done
-- Whether @fire_time was already reconciled (started).
--   @fire_time  timestamptz  the cron fire time
SELECT EXISTS (SELECT 1 FROM reconcile_runs WHERE fire_time = @fire_time)

-- name: pending_rows
-- Up to @limit undelivered, not dead rows above @cursor, in id order
-- (Reconciler.PendingRows): id, created_at, aggregate_type, aggregate_id,
-- event_type. The primary key from above both cursors in id order (never
-- the history below the saved one), and the rows backing off below it
-- through their own index (outbox_backoff_idx, the only index for a
-- condition alone behind OFFSET 0; with the id range beside it the planner
-- walks the primary key over the whole history instead). Above the cursors
-- the pending condition is written in an opaque form (COALESCE) that no
-- partial index's predicate follows from: written plainly, a plan made
-- after ANALYZE saw few pending rows can walk outbox_pending_aggregate_idx
-- whole (its entries for the history a held snapshot keeps included) and
-- sort.
--   @cursor  bigint  the sweep's position
--   @limit   int     rows, at most
--   @floor   bigint  the floor without a saved cursor (sweep_floor in cursor.sql)
WITH {{sweep_floor}}
SELECT id, created_at, aggregate_type, aggregate_id, event_type FROM (
  (SELECT id, created_at, aggregate_type, aggregate_id, event_type FROM outbox
   WHERE COALESCE(dispatched_at IS NULL AND dead_at IS NULL, false) AND id > GREATEST(@cursor::bigint, (SELECT lo FROM lowcur))
   ORDER BY id LIMIT @limit::int)
  UNION ALL
  (SELECT * FROM (SELECT id, created_at, aggregate_type, aggregate_id, event_type FROM outbox
     WHERE {{backing_off}} OFFSET 0) b
   WHERE id > @cursor::bigint AND id <= (SELECT lo FROM lowcur))) p
ORDER BY id LIMIT @limit::int

-- name: content_digests
-- Each row's digest of its payload and headers, as keys.ContentOf
-- computes it from the bytes a read of those columns returns: the first 8
-- bytes of SHA-256(SHA-256(payload) || SHA-256(headers)), each over the
-- jsonb's text in UTF-8, which is what a read returns for the column
-- (jsonb's binary form is a version byte and that same text), a NULL as
-- empty. Computed here, so the repair sweep loads no payload.
--   @ids  bigint[]  the rows
SELECT id, substr(sha256(sha256(convert_to(COALESCE(payload::text, ''), 'UTF8'))
  || sha256(convert_to(COALESCE(headers::text, ''), 'UTF8'))), 1, 8) FROM outbox WHERE id = ANY (@ids::bigint[])

-- name: pending_by_attempts
-- Undelivered rows per attempts value (attempts, count), the rows stats
-- counts: the rows above the cursor through the primary key (the pending
-- condition behind OFFSET 0: with it beside the range, a plan made on a
-- small table walked outbox_pending_aggregate_idx whole, its history's
-- entries included), and those backing off below it as in pending_rows.
--   @floor  bigint  the floor without a saved cursor (sweep_floor in cursor.sql)
WITH {{sweep_floor}}
SELECT attempts, count(*) FROM (
  SELECT attempts FROM (SELECT attempts, dispatched_at IS NULL AND dead_at IS NULL AS pending FROM outbox
    WHERE id > (SELECT lo FROM lowcur) OFFSET 0) a
  WHERE pending
  UNION ALL
  SELECT attempts FROM (SELECT id, attempts FROM outbox WHERE {{backing_off}} OFFSET 0) b
  WHERE id <= (SELECT lo FROM lowcur)) p
GROUP BY attempts

-- name: purge_delivered
-- Deletes one batch of delivered rows older than @age_us, fenced, with
-- their attempt history. Rows are taken in (dispatched_at, id) order
-- through outbox_dispatched_idx; the cursor's own time is walked again
-- only for the ids after it (one batch's marks share a time). The age
-- condition is in the DELETE's own WHERE too: a row updated after the
-- statement's snapshot (an operator making it pending again) is re-checked
-- by Postgres against those conditions only, not against the subquery
-- that chose its id, and was deleted
-- (TestPurgeKeepsARowMadePendingWhileItRuns). Returns the fence's
-- outcome, the rows deleted, and the last one's time and id (the next
-- cursor).
--   @lock, @token, @owner  the fence (fence.sql)
--   @age_us    bigint       rows older than now() minus this many µs
--   @after_at  timestamptz  the cursor's time
--   @after_id  bigint       the cursor's id
--   @limit     int          rows, at most
{{fence}},
del AS (
  DELETE FROM outbox WHERE id = ANY (ARRAY(
    SELECT id FROM outbox WHERE dispatched_at < now() - @age_us::bigint * interval '1 microsecond' AND dispatched_at >= @after_at AND (dispatched_at > @after_at OR id > @after_id)
    ORDER BY dispatched_at, id LIMIT @limit))
  AND dispatched_at < now() - @age_us::bigint * interval '1 microsecond' AND EXISTS (SELECT 1 FROM fence)
  RETURNING id, dispatched_at AS at),
history AS (DELETE FROM outbox_attempts a WHERE a.outbox_id IN (SELECT id FROM del)),
lastrow AS (SELECT at, id FROM del ORDER BY at DESC, id DESC LIMIT 1)
SELECT EXISTS (SELECT 1 FROM fence), (SELECT count(*) FROM del),
  COALESCE((SELECT at FROM lastrow), @after_at), COALESCE((SELECT id FROM lastrow), @after_id)

-- name: purge_dead
-- purge_delivered for dead rows: dead_at for dispatched_at, through
-- outbox_dead_list_idx.
--   @lock, @token, @owner  the fence (fence.sql)
--   @age_us    bigint       rows older than now() minus this many µs
--   @after_at  timestamptz  the cursor's time
--   @after_id  bigint       the cursor's id
--   @limit     int          rows, at most
{{fence}},
del AS (
  DELETE FROM outbox WHERE id = ANY (ARRAY(
    SELECT id FROM outbox WHERE dead_at < now() - @age_us::bigint * interval '1 microsecond' AND dead_at >= @after_at AND (dead_at > @after_at OR id > @after_id)
    ORDER BY dead_at, id LIMIT @limit))
  AND dead_at < now() - @age_us::bigint * interval '1 microsecond' AND EXISTS (SELECT 1 FROM fence)
  RETURNING id, dead_at AS at),
history AS (DELETE FROM outbox_attempts a WHERE a.outbox_id IN (SELECT id FROM del)),
lastrow AS (SELECT at, id FROM del ORDER BY at DESC, id DESC LIMIT 1)
SELECT EXISTS (SELECT 1 FROM fence), (SELECT count(*) FROM del),
  COALESCE((SELECT at FROM lastrow), @after_at), COALESCE((SELECT id FROM lastrow), @after_id)
