-- Fenced writes: the fence every write of the poller and the reconciler
-- starts with, and the reads of the tokens Postgres has accepted.

-- fragment: fence
-- Locks the lock's fence row and raises it to the writer's token, or
-- returns no row when Postgres already accepted a higher token, or the
-- same token from another owner. Every fenced statement starts with it
-- (WITH {{fence}}, ...), guards its write with EXISTS (SELECT 1 FROM
-- fence), and returns EXISTS (SELECT 1 FROM fence) as its first column
-- (Store.fenced).
--
-- The row is written only to raise it (the first write of a term): a
-- holder's later writes carry the token already there and only lock the
-- row (FOR UPDATE writes no new row version). Updating it on every write,
-- as an upsert would, leaves one dead version per batch that a snapshot
-- held elsewhere keeps from vacuum, and every later write would walk them
-- all to find the live one, at a cost growing without bound.
-- A writer that waits for the lock sees the row as its holder left it
-- (READ COMMITTED re-reads a locked row), so it is refused if that holder
-- raised the token meanwhile.
--
-- Parameters (every fenced statement's first three):
--   @lock   text    the lock's name (Fence.Lock)
--   @token  bigint  the writer's fencing token (Fence.Token)
--   @owner  text    the acquisition's owner value (Fence.Owner)
WITH cur AS MATERIALIZED (
  SELECT f.token, f.owner FROM outbox_fence f WHERE f.lock_name = @lock::text FOR UPDATE),
raised AS (
  INSERT INTO outbox_fence AS f (lock_name, token, owner)
  SELECT @lock::text, @token::bigint, @owner::text WHERE NOT EXISTS (SELECT 1 FROM cur WHERE cur.token >= @token::bigint)
  ON CONFLICT (lock_name) DO UPDATE SET token = EXCLUDED.token, owner = EXCLUDED.owner
  WHERE f.token < EXCLUDED.token
     OR (f.token = EXCLUDED.token AND f.owner IS NOT DISTINCT FROM EXCLUDED.owner)
  RETURNING token),
fence AS (
  SELECT cur.token FROM cur WHERE cur.token = @token::bigint AND cur.owner IS NOT DISTINCT FROM @owner::text
  UNION ALL SELECT token FROM raised)

-- name: fence_token
-- The highest token Postgres has accepted for a lock (no row: none).
--   @lock  text  the lock's name
SELECT token FROM outbox_fence WHERE lock_name = @lock

-- name: fence_tokens
-- Every lock's accepted token: lock_name, token.
SELECT lock_name, token FROM outbox_fence ORDER BY lock_name

-- name: claim_fence
-- Raises the fence to the holder's token before it acts, committing
-- synchronously whatever the server's or connection's default (a raised
-- fence must survive a crash). Returns the fence's outcome.
--   @lock, @token, @owner  the fence
{{fence}},
sync AS (SELECT set_config('synchronous_commit', 'on', true))
SELECT EXISTS (SELECT 1 FROM fence) FROM sync
