-- name: due_now
-- Makes the rows @ids that are backing off due now (a destination that
-- failed them has recovered), as one fenced statement: rows still pending,
-- not dead, tried before and not yet due. Their attempts and last_error
-- stay. available_at stays above created_at, so the read path finds them
-- through outbox_backoff_idx, as it finds every row backing off. Returns
-- the fence's outcome and how many rows it changed.
--   @lock, @token, @owner  the fence (fence.sql)
--   @ids  bigint[]  the rows to make due
{{fence}},
resumed AS (
  UPDATE outbox SET available_at = now()
  WHERE id = ANY(@ids::bigint[]) AND dispatched_at IS NULL AND dead_at IS NULL
    AND attempts > 0 AND available_at > now() AND EXISTS (SELECT 1 FROM fence)
  RETURNING 1)
SELECT EXISTS (SELECT 1 FROM fence), (SELECT count(*) FROM resumed)
