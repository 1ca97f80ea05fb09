-- The poller's write of a batch's outcome (Store.Complete).

-- name: complete
-- One fenced statement: delivered rows get dispatched_at; failures bump
-- attempts and get last_error plus either a new available_at (now() +
-- delay) or dead_at, and an entry in the row's attempt history. It
-- returns the fence's outcome, the rows delivered, the rows failed.
--
-- It commits asynchronously: synchronous_commit is off for its own
-- transaction only (set_config local, in the statement, so it costs no
-- round trip). See Complete for why that is safe.
--
-- The failures' pending condition is written in the opaque COALESCE form
-- (backoff.sql): as a plain conjunction it matched
-- outbox_pending_aggregate_idx's predicate, and the generic plan made on a
-- small table would hash that whole index to join the batch's failures:
-- every batch with a failure would walk every pending row and, under a
-- snapshot held elsewhere, every row delivered since
-- (TestHotPathPlansMadeOnASmallTableStayFlat).
--
-- The delivered rows are found by one scan of the primary key for the
-- batch's ids (= ANY), and each is checked against its (id, created_at)
-- pair in a hash (NOT ... NOT IN: a hashed subplan, not a join the planner
-- could make a loop of). Joined to the pairs (unnest), the plan would probe
-- the primary key once per row, and each probe would read the row's heap
-- page again where the scan keeps it pinned from row to row: one buffer
-- more per row.
--
-- history records each failure the statement wrote (failed: id, attempts
-- after it, created_at) in outbox_attempts: the failure's kind and send
-- duration in ms (-1: unknown), the start of its text, Postgres' now() and
-- the writer's token, numbered after the row's last replay entry (base:
-- its attempt, 0 without one) plus its attempts, so the entries from
-- before a replay stay; trimmed drops the row's entries older than its
-- last 10 (MaxHistory) but never that replay entry, or numbered above. Both are driven by the failures' ids (the primary key), so
-- a batch without failures touches nothing there.
--
-- Parameters:
--   @lock, @token, @owner  the fence (fence.sql)
--   @delivered_ids         text (int8 array literal) the delivered rows' ids
--   @failed_ids            bigint[]       the failed rows' ids
--   @failed_errors         text[]         their last_error
--   @failed_delay_us       bigint[]       their delay before the next try, µs
--   @failed_dead           bool[]         whether each is dead-lettered now
--   @delivered_created_at  timestamptz[]  the delivered rows' created_at as read
--   @failed_created_at     timestamptz[]  the failed rows' created_at as read (NULL: by id alone)
--   @failed_kinds          text[]         each failure's kind (attempt history)
--   @failed_ms             bigint[]       each send's duration in ms, -1 unknown
{{fence}},
async AS (SELECT set_config('synchronous_commit', 'off', true)),
delivered AS (
  UPDATE outbox o SET dispatched_at = now(), last_error = NULL
  WHERE o.id = ANY (@delivered_ids::bigint[]) AND o.dispatched_at IS NULL
    AND NOT ((o.id, o.created_at) NOT IN (SELECT * FROM unnest(@delivered_ids::bigint[], @delivered_created_at::timestamptz[]))) -- hashed
    AND EXISTS (SELECT 1 FROM fence)
  RETURNING 1),
failed AS (
  UPDATE outbox o SET attempts = LEAST(GREATEST(o.attempts, 0), 2147483646) + 1, last_error = x.err,
    available_at = CASE WHEN x.dead THEN o.available_at ELSE now() + x.delay_us * interval '1 microsecond' END,
    dead_at = CASE WHEN x.dead THEN now() END
  FROM unnest(@failed_ids::bigint[], @failed_errors::text[], @failed_delay_us::bigint[], @failed_dead::bool[], @failed_created_at::timestamptz[]) AS x(id, err, delay_us, dead, created_at)
  WHERE o.id = x.id AND (x.created_at IS NULL OR o.created_at = x.created_at)
    AND COALESCE(o.dispatched_at IS NULL AND o.dead_at IS NULL, false) AND EXISTS (SELECT 1 FROM fence)
  RETURNING o.id, o.attempts, o.created_at),
base AS (
  SELECT f.id, f.attempts, f.created_at, COALESCE((SELECT max(a.attempt) FROM outbox_attempts a
    WHERE a.outbox_id = f.id AND a.created_at = f.created_at AND a.kind = 'replay'), 0) AS b
  FROM failed f),
history AS (
  INSERT INTO outbox_attempts (outbox_id, attempt, created_at, kind, excerpt, duration_ms, fencing_token)
  SELECT f.id, f.b + f.attempts, f.created_at, h.kind, left(h.err, 300), NULLIF(h.ms, -1), @token::bigint
  FROM base f JOIN unnest(@failed_ids::bigint[], @failed_errors::text[], @failed_kinds::text[], @failed_ms::bigint[]) AS h(id, err, kind, ms) ON h.id = f.id
  ON CONFLICT (outbox_id, attempt) DO UPDATE SET created_at = EXCLUDED.created_at, at = now(), kind = EXCLUDED.kind,
    excerpt = EXCLUDED.excerpt, duration_ms = EXCLUDED.duration_ms, fencing_token = EXCLUDED.fencing_token
  RETURNING 1),
trimmed AS (
  DELETE FROM outbox_attempts a WHERE a.outbox_id = ANY (@failed_ids::bigint[])
    AND EXISTS (SELECT 1 FROM base f WHERE f.id = a.outbox_id
      AND (a.attempt <= f.b + f.attempts - 10 OR a.attempt > f.b + f.attempts)
      AND NOT (a.kind = 'replay' AND a.attempt = f.b))
  RETURNING 1)
SELECT EXISTS (SELECT 1 FROM fence), (SELECT count(*) FROM delivered), (SELECT count(*) FROM failed) FROM async
