-- Destinations an operator paused (outbox_paused_destinations).

-- name: pause
-- Pauses the destinations @names (already paused ones keep their
-- paused_at), as one fenced statement. Returns the fence's outcome and how
-- many were not paused before.
--   @lock, @token, @owner  the fence (fence.sql)
--   @names  text[]  the destinations
{{fence}},
added AS (
  INSERT INTO outbox_paused_destinations (destination, token)
  SELECT d, @token::bigint FROM unnest(@names::text[]) d WHERE EXISTS (SELECT 1 FROM fence)
  ON CONFLICT (destination) DO NOTHING
  RETURNING 1)
SELECT EXISTS (SELECT 1 FROM fence), (SELECT count(*) FROM added)

-- name: resume
-- Resumes the destinations @names, or every one when @all, as one fenced
-- statement. Returns the fence's outcome and how many were paused.
--   @lock, @token, @owner  the fence (fence.sql)
--   @names  text[]  the destinations
--   @all    bool    every paused destination
{{fence}},
removed AS (
  DELETE FROM outbox_paused_destinations
  WHERE (@all::bool OR destination = ANY(@names::text[])) AND EXISTS (SELECT 1 FROM fence)
  RETURNING 1)
SELECT EXISTS (SELECT 1 FROM fence), (SELECT count(*) FROM removed)

-- name: paused_list
-- The paused destinations by name: destination, paused_at.
SELECT destination, paused_at FROM outbox_paused_destinations ORDER BY destination
