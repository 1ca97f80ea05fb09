-- The relay's read (Store.Read in read.go; parameters from readArgs): in
-- one statement, and so one snapshot (pg_current_snapshot() is the
-- statement's own), the due rows to send and what the poller needs to move
-- its place on. Its cost depends on the rows above the cursor and on the
-- gaps and aggregates it is given, not on how many rows were delivered
-- before. {{name}} is a fragment of read.go (readFragments). The
-- statement is the text after this header, the same for every call.
--
-- Parameters:
--   $1   cursor (ReadPos.Cursor): the scan for new rows starts above it
--   $2   rows (FetchLimits.Rows): rows scanned above the cursor, and rows
--        returned, at most
--   $3   frontier (ReadPos.Frontier, at least the cursor): new gaps are
--        looked for above it
--   $4   span (ReadPos.Span, 0: defaultSpan): ids classified by one read,
--        at most
--   $5   watch (ReadPos.Watch): gap ids looked up by primary key
--   $6   holding gap ids, $7 their horizons (ReadPos.Holding)
--   $8   parked aggregate types, $9 their ids, $10 the lowest id of each
--        (ReadPos.Parked)
--   $11  skip (FetchLimits.Skip): ids in flight, never returned
--   $12  row bytes (FetchLimits.RowBytes): a larger row comes back
--        unloaded, its texts cut (poison)
--   $13  busy aggregate types, $14 their ids (FetchLimits.Busy)
--   $15  bytes (FetchLimits.Bytes): the batch's byte budget; the first row
--        goes whatever its size
--
-- Common table expressions:
--   snap     the snapshot's xmin and xmax, the ids' epoch, the server's
--            incarnation, the id sequence's last value
--   hot      the first $2 pending rows above $1, through
--            outbox_pending_idx from the cursor on: settled rows below it,
--            and their index entries vacuum could not remove, are never
--            walked
--   span     top, the highest id classified (the highest hot id, at most
--            $3 + $4), and dense: the hot ids fill ($3, top]
--   holes    the ids in ($3, top] between consecutive hot ids (lag over the
--            hot rows in id order); nothing when dense (a One-Time Filter:
--            the sort and window never run)
--   newgaps  the holes with no row visible: new gaps
--   watched  the watched ids ($5) visible now
--   hold     the lowest id that may still commit below visible rows: the
--            lowest new gap, the lowest holding gap ($6) not visible whose
--            horizon ($7) the snapshot's xmin has not reached, or top + 1;
--            rows at or above it are not returned (their aggregate is
--            unknown until it commits)
--   parked   each parked aggregate's first pending row in [$10, $1], and
--            whether an earlier row of it backs off
--   lowids   candidates from below the cursor: due rows of
--            outbox_backoff_idx (above the cursor only those above every
--            hot row and below hold, and not while an untried row of their
--            aggregate lies between), rows of parked aggregates not blocked,
--            watched gaps pending at or below the cursor
--   low      those rows, by primary key
--   out      the batch: candidates (hot below hold, and low) that are due,
--            not skipped, not busy, not blocked, the first $2 in id order
--            within the byte budget
--
-- Rows returned, told apart by kind (readKind* in read.go); the columns
-- are kind, id, aggregate_type, aggregate_id, event_type, payload,
-- headers, created_at, attempts, size, far, state:
--   r  a row to send: every column but state (texts cut, payload and
--      headers NULL for a row above $12 or far ahead)
--   h  a hot row not returned: id, aggregate, state (store.Hot*)
--   s  the snapshot: xmin (id), epoch (aggregate_type), incarnation
--      (aggregate_id), xmax (size)
--   q  the sequence's last value (id), when the role may read it
--   c  the highest id classified (size)
--   g  a new gap (id)
--   w  a watched id visible now: id, aggregate, pending (far)
--   p  a parked aggregate: its first row (id; 0: none left), aggregate
--
-- How it keeps its plan flat:
--   - Lookups by id are written = ANY (ARRAY(...)), so they are
--     primary-key probes whatever the estimates.
--   - The holes come from the hot rows themselves (lag), not from
--     "id NOT IN (SELECT id FROM hot)" over the span: that subplan is
--     hashed only while the planner's estimate of hot fits in work_mem,
--     and otherwise scans hot once per id.
--   - Rows backing off above the cursor are compared with hot's highest
--     id, not looked up in hot.
--   - The candidates are joined with UNION ALL, not UNION: "o.id = ANY"
--     takes each row once anyway, and UNION's hash table is sized from
--     the rows the plan expects, not the rows that come.
--   - The skipped ids are looked up in a hashed subplan, and only for
--     candidates at or below the highest of them; the busy aggregates in
--     a hashed subplan too.
--   - The batch is cut (a sort, a window) on ids and sizes; the rows are
--     then taken from hot and low whose ids out holds (NOT ... NOT IN, so
--     that it stays a hashed subplan, not a join), so payloads are not
--     copied through the cut. Read sorts the rows by id.
--   - The CTEs are MATERIALIZED: each runs once.
--   - low has no pending condition: it would let the planner pick a
--     partial index over every pending row instead of the primary key.

WITH snap AS MATERIALIZED (
  SELECT pg_snapshot_xmin(s)::text::bigint AS xmin, pg_snapshot_xmax(s)::text::bigint AS xmax, {{epochOf}} AS epoch,
    {{incarnation}} AS incarnation, {{seqLast}} AS seqlast
  FROM pg_current_snapshot() s, {{idSeq}}),
hot AS MATERIALIZED (
  SELECT {{readColumns}}
  FROM outbox o
  WHERE o.dispatched_at IS NULL AND o.dead_at IS NULL AND o.id > $1::bigint
  ORDER BY o.id LIMIT $2::int),
span AS MATERIALIZED (
  SELECT t.top, (SELECT count(*) FROM hot WHERE hot.id > $3::bigint AND hot.id <= t.top) = t.top - $3::bigint AS dense
  FROM (SELECT CASE WHEN max(id) IS NULL THEN $3::bigint ELSE GREATEST(LEAST(max(id), $3::bigint + $4::bigint), $3::bigint) END AS top FROM hot) t),
holes AS MATERIALIZED (
  SELECT g.id FROM (
    SELECT x.id, lag(x.id, 1, $3::bigint) OVER (ORDER BY x.id) AS prev
    FROM (SELECT hot.id FROM hot, span WHERE hot.id > $3::bigint AND hot.id <= span.top
      UNION ALL SELECT span.top + 1 FROM span) x) s
  CROSS JOIN LATERAL generate_series(s.prev + 1, s.id - 1) g(id)
  WHERE s.id > s.prev + 1 AND NOT (SELECT dense FROM span)),
newgaps AS MATERIALIZED (
  SELECT id FROM holes
  WHERE id <> ALL (ARRAY(SELECT x.id FROM outbox x WHERE x.id = ANY (ARRAY(SELECT id FROM holes))))),
watched AS MATERIALIZED (
  SELECT x.id, x.aggregate_type, x.aggregate_id, x.dispatched_at IS NULL AND x.dead_at IS NULL AS pending
  FROM outbox x WHERE x.id = ANY ($5::bigint[])),
hold AS MATERIALIZED (
  SELECT LEAST(
    (SELECT min(id) FROM newgaps),
    (SELECT min(k.id) FROM unnest($6::bigint[], $7::bigint[]) k(id, horizon), snap
      WHERE k.horizon > snap.xmin AND k.id NOT IN (SELECT id FROM watched)),
    (SELECT top FROM span) + 1) AS h),
parked AS MATERIALIZED (
  SELECT p.t, p.a, f.id AS first,
    EXISTS (SELECT 1 FROM outbox e
      WHERE e.aggregate_type = p.t AND e.aggregate_id = p.a AND e.id < f.id
        AND {{backingOffE}} AND e.available_at > now()) AS blocked
  FROM unnest($8::text[], $9::text[], $10::bigint[]) p(t, a, lo)
  LEFT JOIN LATERAL (
    SELECT o.id FROM outbox o
    WHERE o.aggregate_type = p.t AND o.aggregate_id = p.a AND o.id >= p.lo AND o.id <= $1::bigint
      AND o.dispatched_at IS NULL AND o.dead_at IS NULL AND o.available_at <= o.created_at
    ORDER BY o.id LIMIT 1) f ON true),
lowids AS MATERIALIZED (
  SELECT e.id FROM outbox e, hold
  WHERE {{backingOffE}}
    AND (e.available_at <= now() OR e.available_at > now() + interval '100 years')
    AND (e.id <= $1::bigint OR (e.id < hold.h AND e.id > (SELECT COALESCE(max(id), $1::bigint) FROM hot)
      AND NOT EXISTS (SELECT 1 FROM outbox u
        WHERE u.aggregate_type = e.aggregate_type AND u.aggregate_id = e.aggregate_id
          AND u.id > (SELECT COALESCE(max(id), $1::bigint) FROM hot) AND u.id < e.id
          AND u.dispatched_at IS NULL AND u.dead_at IS NULL AND u.available_at <= u.created_at)))
  UNION ALL SELECT o.id FROM parked p CROSS JOIN LATERAL (
      SELECT o.id FROM outbox o
      WHERE o.aggregate_type = p.t AND o.aggregate_id = p.a AND o.id >= p.first AND o.id <= $1::bigint
        AND o.dispatched_at IS NULL AND o.dead_at IS NULL AND o.available_at <= o.created_at
      ORDER BY o.id LIMIT $2::int) o
    WHERE p.first IS NOT NULL AND NOT p.blocked
  UNION ALL SELECT id FROM watched WHERE pending AND id <= $1::bigint),
low AS MATERIALIZED (
  -- No pending condition here: it would let the planner pick a partial
  -- index over every pending row instead of the primary key.
  SELECT {{readColumns}}, o.dispatched_at IS NULL AND o.dead_at IS NULL AS pending
  FROM outbox o
  WHERE o.id = ANY (ARRAY(SELECT id FROM lowids))),
out AS MATERIALIZED (
  SELECT id FROM (
    SELECT d.id, sum(CASE WHEN d.size <= $12::bigint THEN d.size::int4 ELSE 0 END) OVER w AS loaded, row_number() OVER w AS n
    FROM (
      SELECT c.id, c.size FROM (
        SELECT hot.id, hot.aggregate_type, hot.aggregate_id, hot.notdue, hot.blocked, hot.size FROM hot, hold WHERE hot.id < hold.h
        UNION ALL SELECT id, aggregate_type, aggregate_id, notdue, blocked, size FROM low WHERE pending) c
      WHERE NOT (c.notdue OR c.blocked)
        AND (c.id > (SELECT max(s) FROM unnest($11::bigint[]) s) OR c.id NOT IN (SELECT unnest($11::bigint[]))) -- hashed: see readSQL
        AND (c.aggregate_type, c.aggregate_id) NOT IN (SELECT * FROM unnest($13::text[], $14::text[]))
      ORDER BY c.id LIMIT $2::int) d
    WINDOW w AS (ORDER BY d.id ROWS UNBOUNDED PRECEDING)) taken
  WHERE n = 1 OR loaded <= $15::bigint)
SELECT 'r' AS kind, id,
  CASE WHEN size <= $12::bigint THEN aggregate_type ELSE left(aggregate_type, 200) END,
  CASE WHEN size <= $12::bigint THEN aggregate_id ELSE left(aggregate_id, 200) END,
  CASE WHEN size <= $12::bigint THEN event_type ELSE left(event_type, 200) END,
  CASE WHEN size <= $12::bigint AND NOT far THEN payload END, CASE WHEN size <= $12::bigint AND NOT far THEN headers END,
  created_at, attempts, size, far, NULL::text AS state
FROM (SELECT hot.* FROM hot WHERE NOT (hot.id NOT IN (SELECT id FROM out))
  UNION ALL SELECT {{readColumnNames}} FROM low WHERE pending AND NOT (low.id NOT IN (SELECT id FROM out))) r
UNION ALL
SELECT 'h', hot.id, hot.aggregate_type, hot.aggregate_id, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
  CASE WHEN hot.id >= hold.h THEN 'h'
       WHEN hot.notdue THEN 'd'
       WHEN hot.id IN (SELECT unnest($11::bigint[])) THEN 's'
       WHEN (hot.aggregate_type, hot.aggregate_id) IN (SELECT * FROM unnest($13::text[], $14::text[])) THEN 'u'
       WHEN hot.blocked THEN 'b'
       ELSE 'c' END
FROM hot, hold WHERE hot.id NOT IN (SELECT id FROM out)
UNION ALL
SELECT 's', snap.xmin, snap.epoch, snap.incarnation, NULL, NULL, NULL, NULL, NULL, snap.xmax, NULL, NULL FROM snap
UNION ALL
SELECT 'q', snap.seqlast, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM snap WHERE snap.seqlast IS NOT NULL
UNION ALL
SELECT 'c', span.top, NULL, NULL, NULL, NULL, NULL, NULL, NULL, span.top, NULL, NULL FROM span
UNION ALL
SELECT 'g', id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM newgaps
UNION ALL
SELECT 'w', id, aggregate_type, aggregate_id, NULL, NULL, NULL, NULL, NULL, NULL, pending, NULL FROM watched
UNION ALL
SELECT 'p', COALESCE(first, 0), t, a, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM parked
