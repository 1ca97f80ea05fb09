-- The relay's read (Store.Read in read.go, arguments from readArgs) and
-- the pieces of it that other statements share.

-- name: read
-- In one statement, and so one snapshot (pg_current_snapshot() is the
-- statement's own), the due rows to send and what the poller needs to move
-- its place on. Its cost depends on the rows above the cursor and on the
-- gaps and aggregates it is given, not on how many rows were delivered
-- before. Its fragments are read_columns and row_size (below),
-- backing_off_e (backoff.sql), epoch_of and id_seq (cursor.sql),
-- incarnation and seq_last (below).
--
-- Parameters:
--   @cursor            bigint    ReadPos.Cursor: the scan for new rows starts above it
--   @rows              int       FetchLimits.Rows: rows scanned above the cursor, and rows
--                                returned, at most
--   @frontier          bigint    ReadPos.Frontier (at least the cursor): new gaps are
--                                looked for above it
--   @span              bigint    ReadPos.Span (0: defaultSpan): ids classified by one
--                                read, at most
--   @watch             bigint[]  ReadPos.Watch: gap ids looked up by primary key
--   @holding_ids       bigint[]  ReadPos.Holding: gap ids holding the rows above them
--   @holding_horizons  bigint[]  their horizons
--   @parked_types      text[]    ReadPos.Parked: aggregate types
--   @parked_ids        text[]    their aggregate ids
--   @parked_mins       bigint[]  the lowest id of each
--   @skip              text      FetchLimits.Skip (int8 array literal): ids in flight,
--                                never returned
--   @row_bytes         bigint    FetchLimits.RowBytes: a larger row comes back
--                                unloaded, its texts cut (poison)
--   @busy_types        text[]    FetchLimits.Busy: aggregate types
--   @busy_ids          text[]    their aggregate ids
--   @bytes             bigint    FetchLimits.Bytes: the batch's byte budget; the first
--                                row goes whatever its size
--
-- Common table expressions:
--   snap     the snapshot's xmin and xmax, the ids' epoch, the server's
--            incarnation, the id sequence's last value
--   hot      the first @rows pending rows above @cursor, through
--            outbox_pending_idx from the cursor on: settled rows below it,
--            and their index entries vacuum could not remove, are never
--            walked
--   span     in one pass over hot: top, the highest id classified (the
--            highest hot id, at most @frontier + @span); dense: the hot ids
--            fill (@frontier, top]; hmax and hn, the highest hot id and how
--            many hot rows there are
--   holes    the ids in (@frontier, top] between consecutive hot ids (lag over the
--            hot rows in id order); nothing when dense (a One-Time Filter:
--            the sort and window never run)
--   newgaps  the holes with no row visible: new gaps
--   watched  the watched ids (@watch) visible now
--   hold     the lowest id that may still commit below visible rows: the
--            lowest new gap, the lowest holding gap (@holding_ids) not visible whose
--            horizon (@holding_horizons) the snapshot's xmin has not reached, or top + 1;
--            rows at or above it are not returned (their aggregate is
--            unknown until it commits)
--   parked   each parked aggregate's first pending row in [@parked_mins, @cursor], and
--            whether an earlier row of it backs off
--   lowids   candidates from below the cursor: due rows of
--            outbox_backoff_idx (above the cursor only those above every
--            hot row and below hold, and not while an untried row of their
--            aggregate lies between), rows of parked aggregates not blocked
--            (the first @rows not in flight: every one is a candidate in
--            out, so out takes them in id order before any later row of
--            the aggregate), watched gaps pending at or below the cursor
--   low      those rows, by primary key
--   out      the batch: candidates (hot below hold, and low) that are due,
--            not skipped, not busy, not blocked, the first @rows in id order
--            within the byte budget
--
-- Rows returned, told apart by kind (readKind* in read.go). Each column
-- holds one thing; a kind fills the columns marked x and leaves the
-- others NULL:
--
--   column          r  h  s  q  c  g  w  p
--   id              x  x           x  x      the row's id (g: the gap's, w: the watched id)
--   aggregate_type  x  x              x  x   (r: cut to 200 for a poison row)
--   aggregate_id    x  x              x  x
--   event_type      x
--   payload         x                        NULL for a row above @row_bytes or far ahead
--   headers         x                        likewise
--   created_at      x
--   attempts        x
--   size            x                        bytes as stored uncompressed (row_size)
--   far             x                        available_at more than 100 years ahead
--   state              x                     why a hot row is not returned (store.Hot*)
--   pending                           x      neither delivered nor dead
--   first_id                             x   its first pending row at or below the
--                                            cursor not backing off; 0: none left
--   xmin, xmax            x                  the snapshot's bounds
--   epoch                 x                  the ids' epoch (epoch in cursor.sql)
--   incarnation           x                  the server's (incarnation)
--   seq_last                 x               the id sequence's last value (seq_last)
--   classified                  x            the highest id classified
--
--   r  a row to send
--   h  a hot row not returned
--   s  the snapshot (one row)
--   q  the sequence (one row, when the role may read it and an id was handed out)
--   c  the span (one row)
--   g  a new gap
--   w  a watched id visible now
--   p  a parked aggregate
--
-- How it keeps its plan flat:
--   - Lookups by id are written = ANY (ARRAY(...)), so they are
--     primary-key probes whatever the estimates.
--   - The holes come from the hot rows themselves (lag), not from
--     "id NOT IN (SELECT id FROM hot)" over the span: that subplan is
--     hashed only while the planner's estimate of hot fits in work_mem,
--     and otherwise scans hot once per id.
--   - Rows backing off above the cursor are compared with hot's highest
--     id (span's hmax), not looked up in hot.
--   - hot is walked once for what span tells, and once more for each of
--     out and the rows returned; the hot rows not returned (kind h) only
--     when out does not hold every hot row. hot's ids are the pending ids
--     in (@cursor, hmax], so out's ids in that range are hot's it holds;
--     low's lie outside it. Counted equal to hn, the test is a One-Time
--     Filter and hot is not walked again.
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
  SELECT pg_snapshot_xmin(s)::text::bigint AS xmin, pg_snapshot_xmax(s)::text::bigint AS xmax, {{epoch_of}} AS epoch,
    {{incarnation}} AS incarnation, {{seq_last}} AS seqlast
  FROM pg_current_snapshot() s, {{id_seq}}),
hot AS MATERIALIZED (
  SELECT {{read_columns}}
  FROM outbox o
  WHERE o.dispatched_at IS NULL AND o.dead_at IS NULL AND o.id > @cursor::bigint
  ORDER BY o.id LIMIT @rows::int),
span AS MATERIALIZED (
  -- The hot ids up to top are those up to the frontier plus the span:
  -- top is the highest hot id when that is in between, the bound when it
  -- is above it, and the frontier (no hot id above it) when it is below.
  SELECT t.top, t.n = t.top - @frontier::bigint AS dense, t.hmax, t.hn
  FROM (SELECT CASE WHEN max(id) IS NULL THEN @frontier::bigint ELSE GREATEST(LEAST(max(id), @frontier::bigint + @span::bigint), @frontier::bigint) END AS top,
    count(*) FILTER (WHERE id > @frontier::bigint AND id <= @frontier::bigint + @span::bigint) AS n,
    max(id) AS hmax, count(*) AS hn FROM hot) t),
holes AS MATERIALIZED (
  SELECT g.id FROM (
    SELECT x.id, lag(x.id, 1, @frontier::bigint) OVER (ORDER BY x.id) AS prev
    FROM (SELECT hot.id FROM hot, span WHERE hot.id > @frontier::bigint AND hot.id <= span.top
      UNION ALL SELECT span.top + 1 FROM span) x) s
  CROSS JOIN LATERAL generate_series(s.prev + 1, s.id - 1) g(id)
  WHERE s.id > s.prev + 1 AND NOT (SELECT dense FROM span)),
newgaps AS MATERIALIZED (
  SELECT id FROM holes
  WHERE id <> ALL (ARRAY(SELECT x.id FROM outbox x WHERE x.id = ANY (ARRAY(SELECT id FROM holes))))),
watched AS MATERIALIZED (
  SELECT x.id, x.aggregate_type, x.aggregate_id, x.dispatched_at IS NULL AND x.dead_at IS NULL AS pending
  FROM outbox x WHERE x.id = ANY (@watch::bigint[])),
hold AS MATERIALIZED (
  SELECT LEAST(
    (SELECT min(id) FROM newgaps),
    (SELECT min(k.id) FROM unnest(@holding_ids::bigint[], @holding_horizons::bigint[]) k(id, horizon), snap
      WHERE k.horizon > snap.xmin AND k.id NOT IN (SELECT id FROM watched)),
    (SELECT top FROM span) + 1) AS h),
parked AS MATERIALIZED (
  SELECT p.t, p.a, f.id AS first,
    EXISTS (SELECT 1 FROM outbox e
      WHERE e.aggregate_type = p.t AND e.aggregate_id = p.a AND e.id < f.id
        AND {{backing_off_e}} AND e.available_at > now()) AS blocked
  FROM unnest(@parked_types::text[], @parked_ids::text[], @parked_mins::bigint[]) p(t, a, lo)
  LEFT JOIN LATERAL (
    SELECT o.id FROM outbox o
    WHERE o.aggregate_type = p.t AND o.aggregate_id = p.a AND o.id >= p.lo AND o.id <= @cursor::bigint
      AND o.dispatched_at IS NULL AND o.dead_at IS NULL AND o.available_at <= o.created_at
    ORDER BY o.id LIMIT 1) f ON true),
lowids AS MATERIALIZED (
  SELECT e.id FROM outbox e, hold
  WHERE {{backing_off_e}}
    AND (e.available_at <= now() OR e.available_at > now() + interval '100 years')
    AND (e.id <= @cursor::bigint OR (e.id < hold.h AND e.id > (SELECT COALESCE(hmax, @cursor::bigint) FROM span)
      AND NOT EXISTS (SELECT 1 FROM outbox u
        WHERE u.aggregate_type = e.aggregate_type AND u.aggregate_id = e.aggregate_id
          AND u.id > (SELECT COALESCE(hmax, @cursor::bigint) FROM span) AND u.id < e.id
          AND u.dispatched_at IS NULL AND u.dead_at IS NULL AND u.available_at <= u.created_at)))
  UNION ALL SELECT o.id FROM parked p CROSS JOIN LATERAL (
      SELECT o.id FROM outbox o
      WHERE o.aggregate_type = p.t AND o.aggregate_id = p.a AND o.id >= p.first AND o.id <= @cursor::bigint
        AND o.dispatched_at IS NULL AND o.dead_at IS NULL AND o.available_at <= o.created_at
        AND o.id NOT IN (SELECT unnest(@skip::bigint[])) -- hashed
      ORDER BY o.id LIMIT @rows::int) o
    WHERE p.first IS NOT NULL AND NOT p.blocked
  UNION ALL SELECT id FROM watched WHERE pending AND id <= @cursor::bigint),
low AS MATERIALIZED (
  -- No pending condition here: it would let the planner pick a partial
  -- index over every pending row instead of the primary key.
  SELECT {{read_columns}}, o.dispatched_at IS NULL AND o.dead_at IS NULL AS pending
  FROM outbox o
  WHERE o.id = ANY (ARRAY(SELECT id FROM lowids))),
out AS MATERIALIZED (
  SELECT id FROM (
    SELECT d.id, sum(CASE WHEN d.size <= @row_bytes::bigint THEN d.size::int4 ELSE 0 END) OVER w AS loaded, row_number() OVER w AS n
    FROM (
      SELECT c.id, c.size FROM (
        SELECT hot.id, hot.aggregate_type, hot.aggregate_id, hot.notdue, hot.blocked, hot.size FROM hot, hold WHERE hot.id < hold.h
        UNION ALL SELECT id, aggregate_type, aggregate_id, notdue, blocked, size FROM low WHERE pending) c
      WHERE NOT (c.notdue OR c.blocked)
        AND (c.id > (SELECT max(s) FROM unnest(@skip::bigint[]) s) OR c.id NOT IN (SELECT unnest(@skip::bigint[]))) -- hashed
        AND (c.aggregate_type, c.aggregate_id) NOT IN (SELECT * FROM unnest(@busy_types::text[], @busy_ids::text[]))
      ORDER BY c.id LIMIT @rows::int) d
    WINDOW w AS (ORDER BY d.id ROWS UNBOUNDED PRECEDING)) taken
  WHERE n = 1 OR loaded <= @bytes::bigint)
SELECT 'r' AS kind, id,
  CASE WHEN size <= @row_bytes::bigint THEN aggregate_type ELSE left(aggregate_type, 200) END AS aggregate_type,
  CASE WHEN size <= @row_bytes::bigint THEN aggregate_id ELSE left(aggregate_id, 200) END AS aggregate_id,
  CASE WHEN size <= @row_bytes::bigint THEN event_type ELSE left(event_type, 200) END AS event_type,
  CASE WHEN size <= @row_bytes::bigint AND NOT far THEN payload END AS payload,
  CASE WHEN size <= @row_bytes::bigint AND NOT far THEN headers END AS headers,
  created_at, attempts, size, far, NULL::text AS state, NULL::bool AS pending, NULL::bigint AS first_id,
  NULL::bigint AS xmin, NULL::bigint AS xmax, NULL::text AS epoch, NULL::text AS incarnation,
  NULL::bigint AS seq_last, NULL::bigint AS classified
FROM (SELECT hot.* FROM hot WHERE NOT (hot.id NOT IN (SELECT id FROM out))
  UNION ALL SELECT id, aggregate_type, aggregate_id, event_type, payload, headers, created_at, attempts, far, notdue, blocked, size FROM low WHERE pending AND NOT (low.id NOT IN (SELECT id FROM out))) r
UNION ALL
SELECT 'h', hot.id, hot.aggregate_type, hot.aggregate_id, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
  CASE WHEN hot.id >= hold.h THEN 'h'
       WHEN hot.notdue THEN 'd'
       WHEN hot.id IN (SELECT unnest(@skip::bigint[])) THEN 's'
       WHEN (hot.aggregate_type, hot.aggregate_id) IN (SELECT * FROM unnest(@busy_types::text[], @busy_ids::text[])) THEN 'u'
       WHEN hot.blocked THEN 'b'
       ELSE 'c' END,
  NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM hot, hold WHERE (SELECT hn FROM span) > (SELECT count(*) FROM out WHERE id > @cursor::bigint AND id <= (SELECT hmax FROM span))
  AND hot.id NOT IN (SELECT id FROM out)
UNION ALL
SELECT 's', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
  snap.xmin, snap.xmax, snap.epoch, snap.incarnation, NULL, NULL FROM snap
UNION ALL
SELECT 'q', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
  NULL, NULL, NULL, NULL, snap.seqlast, NULL FROM snap WHERE snap.seqlast IS NOT NULL
UNION ALL
SELECT 'c', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
  NULL, NULL, NULL, NULL, NULL, span.top FROM span
UNION ALL
SELECT 'g', id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
  NULL, NULL, NULL, NULL, NULL, NULL FROM newgaps
UNION ALL
SELECT 'w', id, aggregate_type, aggregate_id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, pending, NULL,
  NULL, NULL, NULL, NULL, NULL, NULL FROM watched
UNION ALL
SELECT 'p', NULL, t, a, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, COALESCE(first, 0),
  NULL, NULL, NULL, NULL, NULL, NULL FROM parked

-- fragment: read_columns
-- A candidate row as read judges it (columns id, aggregate_type,
-- aggregate_id, event_type, payload, headers, created_at, attempts, far,
-- notdue, blocked, size over alias o). notdue: backing off (far is poison:
-- an available_at no retry could mean). blocked: an earlier row of its
-- aggregate backs off, so per-aggregate order holds. Whether any row backs
-- off at all is asked once per read (an InitPlan), and the probe per row
-- only when one does. The far bound (now() + 100 years) is an InitPlan
-- too, computed once per read, not per row.
o.id, o.aggregate_type, o.aggregate_id, o.event_type, o.payload, o.headers, o.created_at, o.attempts,
    o.available_at > (SELECT now() + interval '100 years') AS far,
    o.available_at > o.created_at AND o.available_at > now() AND o.available_at <= (SELECT now() + interval '100 years') AS notdue,
    CASE WHEN EXISTS (SELECT 1 FROM outbox d WHERE {{backing_off_d}} AND d.available_at > now())
    THEN EXISTS (SELECT 1 FROM outbox e
      WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id
        AND e.id < o.id AND {{backing_off_e}} AND e.available_at > now())
    ELSE false END AS blocked,
    {{row_size}} AS size

-- fragment: row_size
-- Measures row o without sending it: pg_column_size reads the stored size
-- from the datum header. A compressed jsonb (its stored size can be a
-- hundredth of its real size) is measured decompressed: '[]' || x is an
-- uncompressed copy of x (x itself for an array, [x] otherwise), whatever
-- x holds. On large compressed rows that is far cheaper than their text
-- size (jsonb_out) or jsonb_path_query_first.
(CASE WHEN pg_column_compression(o.payload) IS NULL THEN pg_column_size(o.payload)
       ELSE pg_column_size('[]'::jsonb || o.payload) END
  + CASE WHEN pg_column_compression(o.headers) IS NULL THEN pg_column_size(o.headers)
       ELSE pg_column_size('[]'::jsonb || o.headers) END
  + octet_length(o.aggregate_type) + octet_length(o.aggregate_id) + octet_length(o.event_type))::bigint

-- fragment: incarnation
-- Names the server the read ran on: its start time. A failover (the
-- promoted replica is another postmaster), a restored backup or data
-- directory started in place, or any restart changes it; a backend crash
-- that the postmaster recovers from in place (restart_after_crash) does
-- not. PUBLIC may call it, and it touches no buffer. (The WAL timeline adds
-- nothing: every rewind it shows comes with another postmaster, and
-- pg_walfile_name fails on a standby.) As seconds since 1970, so that no
-- session setting (TimeZone, DateStyle) changes the text: connections set
-- differently would otherwise read as servers changing.
extract(epoch FROM pg_postmaster_start_time())::text

-- fragment: seq_last
-- The id sequence's last value (idseq from id_seq), or NULL when the role
-- may not read it: pg_sequence_last_value needs SELECT or USAGE on the
-- sequence, and a relay role with table privileges only must keep working
-- (the CASE keeps the call from running without them, as pg_sequences
-- does). NULL too when no id was handed out since the sequence was created
-- or set with is_called false: its next id is then unknown here, not 0
-- (read as 0, setval(seq, max(id) + 1, false), a forward move, looked like
-- a rewind: a WARN and a cold start; a setval back with is_called false is
-- seen at the first id handed out after it, before any reused id is read).
-- The value only grows while ids are handed out; lower than a value seen
-- before means setval() or a restore moved it back. One buffer more per
-- read: the sequence's page.
CASE WHEN idseq.seq IS NOT NULL AND has_sequence_privilege(idseq.seq, 'SELECT,USAGE')
      THEN pg_sequence_last_value(idseq.seq) END
