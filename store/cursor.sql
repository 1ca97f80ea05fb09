-- Where a holder's reads start and what it inherits: the epoch, the
-- saved cursor, the late-commit checks across a change of holder.

-- fragment: id_seq
-- A FROM item naming the outbox id sequence idseq.seq (NULL without one).
-- OFFSET 0 keeps it one lookup (a pg_depend scan) however often the query
-- uses it; inlined, each use would be a lookup.
(SELECT pg_get_serial_sequence('outbox', 'id')::regclass AS seq OFFSET 0) idseq

-- fragment: epoch_of
-- The epoch in a query that has {{id_seq}} among its FROM items (see
-- epoch).
pg_relation_filenode('outbox'::regclass)::text || '/' || COALESCE(pg_relation_filenode(idseq.seq)::text, '')

-- fragment: epoch
-- Names the storage of the outbox table and its id sequence. Both get new
-- storage when ids start again (TRUNCATE ... RESTART IDENTITY, ALTER TABLE
-- ... ALTER COLUMN id RESTART, ALTER SEQUENCE ... RESTART), and on VACUUM
-- FULL or CLUSTER, where starting afresh costs one cold start. setval()
-- keeps the storage: a rewind by setval is found through the sequence's
-- last value (seq_last in read.sql, poller/rewind.go) or by the rescan.
(SELECT {{epoch_of}} FROM {{id_seq}})

-- fragment: saved_cursor
-- The cursor of the outbox_cursor row of this epoch written last (NULL
-- with none): the poller lock's in use. Every row holds a cursor valid
-- when saved, but the lowest of them may be a row no poller writes any
-- more: one left by a poller lock name changed in the config
-- (poller.lock_name, redis.key_prefix) would keep the backlog count and
-- the sweep walking from its old cursor for ever, more of the history each
-- day, until an operator deleted it. A term under a new lock name has no
-- row of its own, computes its cursor and saves it at its first read, so
-- its row is the last written from then on; the retired name's row is
-- never written again. Two relays under different lock names on one
-- outbox at once (a misconfiguration that sends every row twice) make the
-- floor the one that saved last.
(SELECT cursor FROM outbox_cursor WHERE epoch = {{epoch}} ORDER BY updated_at DESC, cursor LIMIT 1)

-- fragment: sweep_floor
-- The CTE lowcur(lo): the poller's saved cursor in this epoch
-- (saved_cursor), below which every row is delivered, dead or backing off
-- (save_cursor); with none saved, @floor, the floor Store.SweepFloor
-- computed.
lowcur AS MATERIALIZED (
  SELECT COALESCE({{saved_cursor}}, @floor::bigint) AS lo)

-- name: load_cursor
-- Where a new holder's reads start (Store.LoadCursor): the cursor the last
-- holder of @lock saved in this epoch, the sent mark and horizon beside it,
-- and the epoch. With none saved, the cursor is just below @floor's row
-- (the lowest pending row, or the table's highest id when NULL) and at
-- most @span ids below the highest id, and the horizon is this snapshot's
-- xmax.
--   @lock   text    the poller's lock name
--   @span   bigint  how far below the highest id a computed cursor may start
--   @floor  bigint  the id before the lowest pending row (NULL: not looked up yet)
SELECT COALESCE(saved.cursor, LEAST(
    COALESCE(@floor::bigint, top.id),
    GREATEST(top.id - @span, 0))),
  CASE WHEN saved.sent > 0 THEN GREATEST(saved.sent, saved.cursor) ELSE top.id END,
  CASE WHEN saved.cursor IS NULL THEN pg_snapshot_xmax(pg_current_snapshot())::text::bigint ELSE saved.horizon END,
  {{epoch}}
FROM (SELECT (SELECT cursor FROM outbox_cursor WHERE lock_name = @lock AND epoch = {{epoch}}) AS cursor,
    (SELECT sent FROM outbox_cursor WHERE lock_name = @lock AND epoch = {{epoch}}) AS sent,
    (SELECT horizon FROM outbox_cursor WHERE lock_name = @lock AND epoch = {{epoch}}) AS horizon) saved,
  (SELECT COALESCE((SELECT max(id) FROM outbox), 0) AS id) top

-- name: save_cursor
-- Stores where the holder stands, fenced (Store.SaveCursor). Returns the
-- fence's outcome and the rows written (1).
--   @lock, @token, @owner  the fence (fence.sql); @lock names the cursor's row
--   @cursor   bigint  every id at or below it is settled
--   @epoch    text    the epoch the ids belong to
--   @sent     bigint  no id above it was handed on to a sink
--   @horizon  bigint  0, or the xmax a snapshot's xmin must reach before the cursor is settled
{{fence}},
saved AS (
  INSERT INTO outbox_cursor AS c (lock_name, cursor, epoch, sent, horizon) SELECT @lock, @cursor, @epoch, @sent, @horizon WHERE EXISTS (SELECT 1 FROM fence)
  ON CONFLICT (lock_name) DO UPDATE SET cursor = EXCLUDED.cursor, epoch = EXCLUDED.epoch, sent = EXCLUDED.sent,
    horizon = EXCLUDED.horizon, updated_at = now()
  RETURNING 1)
SELECT EXISTS (SELECT 1 FROM fence), (SELECT count(*) FROM saved)

-- name: later_sent
-- For Store.LaterSent: the rows asked about that no holder tried yet, and
-- per aggregate of theirs the highest id dispatched in (@lo, @sent]. The
-- aggregate filter is a hashed subplan (NOT ... NOT IN keeps the planner
-- from turning it into a join it could repeat per row).
--   @ids    bigint[]  the rows asked about
--   @types  text[]    their aggregate types
--   @aggs   text[]    their aggregate ids
--   @lo     bigint    the lowest of them
--   @sent   bigint    the sent mark
--
-- Rows returned (kind, id, aggregate_type, aggregate_id):
--   c  a row asked about, untried
--   o  an aggregate's highest dispatched id in (@lo, @sent]
WITH c AS MATERIALIZED (
  SELECT c.id, c.aggregate_type, c.aggregate_id
  FROM unnest(@ids::bigint[], @types::text[], @aggs::text[]) AS c(id, aggregate_type, aggregate_id)
  JOIN outbox r ON r.id = c.id AND r.attempts = 0 AND r.available_at <= r.created_at)
SELECT 'c', id, aggregate_type, aggregate_id FROM c
UNION ALL
SELECT 'o', max(o.id), o.aggregate_type, o.aggregate_id FROM outbox o
WHERE o.id > @lo AND o.id <= @sent AND o.dispatched_at IS NOT NULL
  AND NOT ((o.aggregate_type, o.aggregate_id) NOT IN (SELECT aggregate_type, aggregate_id FROM c))
GROUP BY o.aggregate_type, o.aggregate_id

-- name: inherited_late
-- What a new holder needs to check the rows it takes in (@lo, @hi] for
-- late commits (Store.InheritedLate), in one statement.
--   @lo     bigint  the loaded cursor
--   @hi     bigint  the sent mark
--   @limit  int     rows of each kind, at most (the caller asks one more)
--
-- Rows returned (hole, x, y):
--   false  a late row: x its id, y the highest dispatched id of its aggregate above it
--   true   a hole: the ids strictly between x and y have no row visible
WITH d AS MATERIALIZED (
  SELECT aggregate_type, aggregate_id, max(id) AS top FROM outbox
  WHERE id > @lo AND id <= @hi AND dispatched_at IS NOT NULL GROUP BY 1, 2),
reach AS (SELECT COALESCE(max(top), @lo) AS id FROM d),
late AS (
  SELECT p.id, d.top FROM outbox p
  JOIN d ON d.aggregate_type = p.aggregate_type AND d.aggregate_id = p.aggregate_id AND d.top > p.id
  WHERE p.id > @lo AND p.id < (SELECT id FROM reach) AND p.dispatched_at IS NULL AND p.dead_at IS NULL
    AND p.attempts = 0 AND p.available_at <= p.created_at
  LIMIT @limit),
holes AS (
  SELECT prev, id FROM (SELECT id, lag(id, 1, @lo) OVER (ORDER BY id) AS prev FROM outbox WHERE id > @lo AND id < (SELECT id FROM reach)) s
  WHERE id > prev + 1 LIMIT @limit),
tail AS (SELECT COALESCE(max(id), @lo) AS id FROM outbox WHERE id > @lo AND id < (SELECT id FROM reach))
SELECT false, id, top FROM late
UNION ALL SELECT true, prev, id FROM holes
UNION ALL SELECT true, tail.id, reach.id FROM tail, reach WHERE tail.id + 1 < reach.id

-- name: pending_between
-- The aggregates with pending rows not backing off in (@lo, @hi], each
-- with its lowest such id (the poller's slow rescan below its cursor):
-- aggregate_type, aggregate_id, min(id).
--   @lo  bigint  exclusive
--   @hi  bigint  inclusive
SELECT aggregate_type, aggregate_id, min(id) FROM outbox
		WHERE dispatched_at IS NULL AND dead_at IS NULL AND available_at <= created_at AND id > @lo AND id <= @hi
		GROUP BY 1, 2

-- name: view_snapshot
-- A repeatable-read transaction's first statement, which takes its
-- snapshot (Store.View).
SELECT 1
