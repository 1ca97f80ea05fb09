-- Destinations an operator paused (outbox_paused_destinations) and the
-- pause generation (outbox_pause_generation): every pause and resume
-- raises it; the leader records the one it has taken into effect.

-- fragment: raise_generation
-- Raises the pause generation in a fenced statement (after {{fence}}):
-- every pause and resume writes a new one.
gen AS (
  INSERT INTO outbox_pause_generation AS g (one, generation)
  SELECT true, 1 WHERE EXISTS (SELECT 1 FROM fence)
  ON CONFLICT (one) DO UPDATE SET generation = g.generation + 1
  RETURNING generation)

-- name: pause
-- Pauses the destinations @names (already paused ones keep their
-- paused_at) and raises the pause generation, as one fenced statement.
-- Returns the fence's outcome, the destinations not paused before and the
-- new generation.
--   @lock, @token, @owner  the fence (fence.sql)
--   @names  text[]  the destinations
{{fence}},
added AS (
  INSERT INTO outbox_paused_destinations (destination, token)
  SELECT d, @token::bigint FROM unnest(@names::text[]) d WHERE EXISTS (SELECT 1 FROM fence)
  ON CONFLICT (destination) DO NOTHING
  RETURNING destination),
{{raise_generation}}
SELECT EXISTS (SELECT 1 FROM fence),
  COALESCE((SELECT array_agg(destination ORDER BY destination) FROM added), '{}'),
  COALESCE((SELECT generation FROM gen), 0)

-- name: resume
-- Resumes the destinations @names, or every one when @all (configured or
-- not), and raises the pause generation, as one fenced statement. Returns
-- the fence's outcome, the destinations resumed and the new generation.
--   @lock, @token, @owner  the fence (fence.sql)
--   @names  text[]  the destinations
--   @all    bool    every paused destination
{{fence}},
removed AS (
  DELETE FROM outbox_paused_destinations
  WHERE (@all::bool OR destination = ANY(@names::text[])) AND EXISTS (SELECT 1 FROM fence)
  RETURNING destination),
{{raise_generation}}
SELECT EXISTS (SELECT 1 FROM fence),
  COALESCE((SELECT array_agg(destination ORDER BY destination) FROM removed), '{}'),
  COALESCE((SELECT generation FROM gen), 0)

-- name: paused_list
-- The paused destinations by name: destination, paused_at.
SELECT destination, paused_at FROM outbox_paused_destinations ORDER BY destination

-- name: pause_set
-- The paused destinations' names and the pause generation they are at,
-- in one snapshot.
SELECT
  COALESCE((SELECT array_agg(destination ORDER BY destination) FROM outbox_paused_destinations), '{}'),
  COALESCE((SELECT generation FROM outbox_pause_generation), 0)

-- name: ack_pause
-- Records that the leader (the fence: its term of lock:outbox:poller) has
-- taken generation @generation into effect; applied never goes back.
-- Returns the fence's outcome and whether it moved.
--   @lock, @token, @owner  the fence (fence.sql)
--   @generation  bigint  the generation taken into effect
{{fence}},
acked AS (
  UPDATE outbox_pause_generation SET applied = @generation::bigint, applied_token = @token::bigint, applied_at = now()
  WHERE applied < @generation::bigint AND EXISTS (SELECT 1 FROM fence)
  RETURNING 1)
SELECT EXISTS (SELECT 1 FROM fence), (SELECT count(*) FROM acked)

-- name: pause_applied
-- The highest pause generation a leader has acknowledged (no row: none).
SELECT applied FROM outbox_pause_generation
