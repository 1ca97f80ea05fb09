package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jackc/pgx/v5/pgtype"
)

// Aggregate names one ordering key.
type Aggregate struct{ Type, ID string }

// Gap is an id below a visible row that was not visible itself when first
// read: a producer transaction that took the id earlier and has not
// committed, or one that rolled back.
type Gap struct {
	ID int64
	// Horizon is the xmax of the snapshot that first missed the id. The
	// transaction owning the id was in that snapshot's in-progress list, so
	// once the oldest running transaction is at or past Horizon (snapshot
	// xmin >= Horizon) it has ended: committed (the row is visible) or not.
	Horizon uint64
}

// Parked is an aggregate that may have pending rows at or below the cursor
// that neither the scan above the cursor nor the delayed index finds: rows
// the scan passed while an earlier row of the aggregate backed off or was
// busy, and rows a batch left undelivered. MinID is its lowest such row.
type Parked struct {
	Aggregate
	MinID int64
}

// ReadPos is where the poller stands; see Read.
type ReadPos struct {
	// Cursor: every id at or below it is delivered, dead, backing off
	// (found through outbox_backoff_idx when due), parked (Parked) or a
	// watched gap (Watch). The scan for new rows starts above it, so it never
	// walks what was settled below, whatever vacuum managed to remove.
	Cursor int64
	// Frontier >= Cursor: every id at or below it is known visible or a
	// tracked gap. New gaps are looked for above it, at most Span ids per
	// read (Span 0: 10,000).
	Frontier int64
	Span     int64
	// Holding are the gaps still holding the rows above them: not seen
	// committed, not settled, not given up (poller.gap_wait). Rows above the
	// lowest of them are not returned.
	Holding []Gap
	// Watch are the gap ids to look up (by primary key): visible ones come
	// back in ReadResult.Visible, and pending visible ones at or below
	// Cursor as rows.
	Watch  []int64
	Parked []Parked
}

// Hot states: why a row read above the cursor was not returned.
const (
	HotHeld    = 'h' // above an unsettled gap, or beyond the ids classified in this read
	HotDelayed = 'd' // not due; outbox_backoff_idx finds it when it is
	HotBlocked = 'b' // an earlier row of its aggregate backs off
	HotSkip    = 's' // in FetchLimits.Skip
	HotBusy    = 'u' // its aggregate is in FetchLimits.Busy
	HotCut     = 'c' // sendable, beyond the batch's rows or bytes
	HotTaken   = 't' // returned
)

// HotRow is one pending row the read saw above the cursor.
type HotRow struct {
	ID        int64
	Aggregate Aggregate
	State     byte // Hot*
}

// Watched is a watched id found visible.
type Watched struct {
	ID        int64
	Aggregate Aggregate
	Pending   bool // neither delivered nor dead
}

// ReadResult is what one Read saw.
type ReadResult struct {
	Rows []Row // due rows to send, id order, within the limits
	// XMin and XMax are the read's snapshot bounds (pg_current_snapshot):
	// every transaction below XMin had ended; new gaps get XMax as Horizon.
	XMin, XMax uint64
	// Epoch names the storage of the outbox table and its id sequence
	// (epochSQL): it changes when TRUNCATE or an id RESTART reuses ids,
	// and a cursor of the old ids means nothing then.
	Epoch string
	// Incarnation names the server the read ran on (incarnationSQL): it
	// changes on a failover, a restore started in place, or a restart.
	Incarnation string
	// SeqLast is the id sequence's last value (seqLastSQL), -1 when the
	// role may not read it or no id was handed out since the sequence was
	// set with is_called false.
	SeqLast int64
	Hot     []HotRow // every pending row read above the cursor, id order
	// Classified is the highest id now known visible or a gap (>= Frontier).
	Classified int64
	NewGaps    []int64 // ids in (Frontier, Classified] not visible
	// Visible are the watched ids now visible, whatever their state.
	Visible []Watched
	// Parked tells, per parked aggregate, its lowest pending row at or
	// below the cursor not backing off; 0 when it has none left.
	Parked map[Aggregate]int64
}

// defaultSpan bounds the new ids one read classifies.
const defaultSpan = 10_000

// readSQL is the relay's fetch. It reads, in one statement and so one
// snapshot (pg_current_snapshot() is the statement's own):
//   - hot: the first $rows pending rows above the cursor ($1), through
//     outbox_pending_idx from the cursor on: settled rows below it, and their
//     index entries that vacuum could not remove, are never walked;
//   - new gaps: ids in (frontier, top] not visible, where top is the highest
//     hot id (at most frontier + span); a primary-key probe only where the
//     hot rows leave a hole. Lookups by id are written = ANY (ARRAY(...)) so
//     the plan is primary-key probes whatever the estimates. When the hot
//     ids fill (frontier, top] (as many as the span holds: the drain's
//     case) there is none, and that count gates the rest (a One-Time
//     Filter: the sort and window below never run; 4.7 -> 3.8 ms per read
//     of 1,000 rows here). Otherwise the holes are
//     the spaces between consecutive hot ids (lag over the hot rows in id
//     order), one pass whatever the estimates: written as "g.id NOT IN
//     (SELECT id FROM hot)" over every id of the span, the subplan was
//     hashed only while the planner's estimate of hot fitted in work_mem
//     (x hash_mem_multiplier); planned from statistics that saw millions
//     of rows pending, it scanned hot once per id, ~500k rows per read of
//     1,000 (47-53 ms instead of 6-9, the same buffers), and a drain behind
//     10M settled rows ran at 33-44% of a clean one
//     (TestReadPlannedOnABigBacklogStaysLinear);
//   - the hold: rows at or above the lowest unsettled gap, known or new,
//     are not returned (its aggregate is unknown until it commits);
//   - below the cursor: due rows of outbox_backoff_idx (backing off, or
//     replayed; see backingOff; above the cursor only those above every
//     hot row, the rest being hot rows: a comparison with hot's highest id,
//     not "NOT IN (SELECT id FROM hot)", which an unhashed plan ran once
//     per backing-off row: 1,000 due retries cost ~1M rows compared per
//     read; and not while an untried row of its aggregate lies between
//     hot's highest id and it, beyond this read like itself: a gap that
//     committed, which a longer read sends first (one probe of
//     outbox_pending_aggregate_idx per such retry;
//     TestReadKeepsADueRetryBehindALowerRowBeyondTheScan)), rows of parked aggregates whose first row is not blocked
//     (outbox_pending_aggregate_idx from that row), and watched gaps that
//     committed late. An id may come from more than one of these; they are
//     joined with UNION ALL, not UNION, because "o.id = ANY (...)" takes
//     each row once anyway, and UNION's hash table is sized from the
//     rows the plan expects, not the rows that come: once an ANALYZE saw
//     the history it expected ~100k (the conditions written opaquely, see
//     backingOff) and built 3 MB per read for none: 0.10 -> 0.25-0.29 ms
//     a read over 10 minutes at 2k ev/s under a held snapshot with
//     autovacuum on, its ANALYZE re-planning the read each minute
//     (TestHotPathPlansMadeOnASmallTableStayFlat).
//
// Candidates are then checked as before: due (available_at <= now(), or so
// far ahead it is poison), not skipped (FetchLimits.Skip: the pipeline's
// rows in flight, up to 4 batches of ids; looked up in a hashed subplan, as
// Busy is: "<> ALL ($11)" compared each candidate with every skipped id,
// 1,000 × 3,000 comparisons per read in a drain, the read's largest CPU
// cost; and only for candidates at or below the highest skipped id: in a
// drain the rows in flight lie at or below the cursor, under every hot
// row, and the hash of up to 3,000 ids was built per read for no row), not
// busy, and not behind an earlier
// row of their aggregate that backs off; the first $rows of them in id
// order, within the byte budget, come back with their payloads (see
// fetchDueSQL for the budget). That cut (a sort, a window, the CTE out) is
// made on narrow rows, ids and sizes; the rows returned are then the hot
// and low rows whose ids out holds (a hashed subplan, written NOT ... NOT
// IN so that it is not made a join), hot's in hot's order and low's after
// them (Read sorts them): carried through the cut, each row's payload and
// headers were copied four more times per read (the sort, the window,
// two materialized CTEs). Both: the backend's CPU per read of 1,000 rows
// in a drain 6.42 -> 5.49 ms (1,500 reads each, alternating, on a loaded
// box; the narrow cut alone 5.86). Then, as rows of other kinds, what the
// poller needs to move: the snapshot, the hot rows' states, the new gaps,
// the visible watched ids and the parked aggregates' first rows.
const readSQL = `
WITH snap AS MATERIALIZED (
  SELECT pg_snapshot_xmin(s)::text::bigint AS xmin, pg_snapshot_xmax(s)::text::bigint AS xmax, ` + epochOfSQL + ` AS epoch,
    ` + incarnationSQL + ` AS incarnation, ` + seqLastSQL + ` AS seqlast
  FROM pg_current_snapshot() s, ` + idSeqSQL + `),
hot AS MATERIALIZED (
  SELECT ` + readColumnsSQL + `
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
        AND ` + backingOffE + ` AND e.available_at > now()) AS blocked
  FROM unnest($8::text[], $9::text[], $10::bigint[]) p(t, a, lo)
  LEFT JOIN LATERAL (
    SELECT o.id FROM outbox o
    WHERE o.aggregate_type = p.t AND o.aggregate_id = p.a AND o.id >= p.lo AND o.id <= $1::bigint
      AND o.dispatched_at IS NULL AND o.dead_at IS NULL AND o.available_at <= o.created_at
    ORDER BY o.id LIMIT 1) f ON true),
lowids AS MATERIALIZED (
  SELECT e.id FROM outbox e, hold
  WHERE ` + backingOffE + `
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
  SELECT ` + readColumnsSQL + `, o.dispatched_at IS NULL AND o.dead_at IS NULL AS pending
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
  UNION ALL SELECT ` + readColumnNames + ` FROM low WHERE pending AND NOT (low.id NOT IN (SELECT id FROM out))) r
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
SELECT 'p', COALESCE(first, 0), t, a, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM parked`

// readColumnNames are readColumnsSQL's names.
const readColumnNames = `id, aggregate_type, aggregate_id, event_type, payload, headers, created_at, attempts, far, notdue, blocked, size`

// readColumnsSQL: a candidate row as readSQL judges it. notdue: backing
// off (far is poison: an available_at no retry could mean). blocked: an
// earlier row of its aggregate backs off, so per-aggregate order holds.
// Whether any row backs off at all is asked once per read (an InitPlan),
// and the probe per row only when one does: without failures the probe
// was half the read's buffer work in a drain (one per row). The far bound
// (now() + 100 years) is an InitPlan too, computed once per read: written
// inline, a generic plan added the interval twice per row (month
// arithmetic), 2-3% of the read's backend CPU in a drain (4.82 -> 4.68 ms
// per read of 1,000 rows, 1,500 alternating reads each).
const readColumnsSQL = `o.id, o.aggregate_type, o.aggregate_id, o.event_type, o.payload, o.headers, o.created_at, o.attempts,
    o.available_at > (SELECT now() + interval '100 years') AS far,
    o.available_at > o.created_at AND o.available_at > now() AND o.available_at <= (SELECT now() + interval '100 years') AS notdue,
    CASE WHEN EXISTS (SELECT 1 FROM outbox d WHERE ` + backingOffD + ` AND d.available_at > now())
    THEN EXISTS (SELECT 1 FROM outbox e
      WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id
        AND e.id < o.id AND ` + backingOffE + ` AND e.available_at > now())
    ELSE false END AS blocked,
    ` + rowSizeSQL + ` AS size`

// Read is the relay's fetch (readSQL): the due rows to send within lim,
// read from pos, and what the poller needs to move pos on. Its cost depends
// on the rows above the cursor and the gaps and aggregates pos names, not on
// how many rows were delivered before.
func (s *Store) Read(ctx context.Context, lim FetchLimits, pos ReadPos) (ReadResult, error) {
	args, rowBytes := readArgs(lim, pos)
	res, err := s.pool.Query(ctx, readSQL, args...)
	if err != nil {
		return ReadResult{}, wrap("read", err)
	}
	defer res.Close()
	out := ReadResult{SeqLast: -1, Parked: map[Aggregate]int64{}, Rows: make([]Row, 0, readCap(lim.Rows, s.readRows.Load()))}
	var ( // declared once: per row they were allocated per row
		kind          string
		id            int64
		aid           pgtype.Text
		typ, evt      string // interned (sameText): not scanned
		payload, hdrs []byte
		created       pgtype.Timestamptz
		attempts      pgtype.Int4
		size          pgtype.Int8
		far           pgtype.Bool
		state         pgtype.Text
	)
	// Built once too: passed to Scan (an interface method) per row, the
	// list of destinations escaped, an allocation of 192 bytes per row.
	dest := []any{&kind, &id, nil, &aid, nil, &payload, &hdrs, &created, &attempts, &size, &far, &state}
	for res.Next() {
		payload, hdrs = nil, nil // the row keeps its own: never reuse them
		if err := res.Scan(dest...); err != nil {
			return ReadResult{}, fmt.Errorf("store: read: %w", err)
		}
		raw := res.RawValues() // text columns: their bytes are the text, binary or not
		typ, evt = sameText(raw[2], typ), sameText(raw[4], evt)
		switch kind {
		case "r":
			x := Row{ID: id, AggregateType: typ, AggregateID: aid.String, EventType: evt,
				Payload: payload, Headers: hdrs, CreatedAt: created.Time, Attempts: int(attempts.Int32), Size: size.Int64}
			switch {
			case x.Size > rowBytes:
				x.Poison = fmt.Sprintf("row is %d bytes, above poller.max_payload_bytes (%d): not loaded, not sent", x.Size, rowBytes)
			case created.InfinityModifier != pgtype.Finite:
				x.Poison = "created_at is infinite: the event cannot be timestamped"
			case far.Bool:
				x.Poison = "available_at is more than 100 years ahead (or infinite): the event would block its aggregate for ever"
			}
			out.Rows = append(out.Rows, x)
		case "h":
			st := byte(HotCut)
			if len(state.String) == 1 {
				st = state.String[0]
			}
			out.Hot = append(out.Hot, HotRow{ID: id, Aggregate: Aggregate{typ, aid.String}, State: st})
		case "s":
			out.XMin, out.XMax, out.Epoch, out.Incarnation = uint64(id), uint64(size.Int64), typ, aid.String
		case "q":
			out.SeqLast = id
		case "c":
			out.Classified = size.Int64
		case "g":
			out.NewGaps = append(out.NewGaps, id)
		case "w":
			out.Visible = append(out.Visible, Watched{ID: id, Aggregate: Aggregate{typ, aid.String}, Pending: far.Bool})
		case "p":
			out.Parked[Aggregate{typ, aid.String}] = id
		default:
			return ReadResult{}, errors.New("store: read: unexpected row kind " + strconv.Quote(kind))
		}
	}
	if err := res.Err(); err != nil {
		return ReadResult{}, wrap("read", err)
	}
	s.readRows.Store(int64(len(out.Rows)))
	// readSQL returns the rows read below the cursor after the hot ones.
	if !slices.IsSortedFunc(out.Rows, byRowID) {
		slices.SortFunc(out.Rows, byRowID)
	}
	return out, nil
}

// readCap is the room a read's rows start with: what the last read
// returned and a quarter more, within the limit. Not the limit itself:
// while events stream a read finds a few rows, and 500 Rows made for each
// (80 KB) were 88% of the bytes the relay allocated at 2k ev/s, 16 GCs a second
// (TestReadAllocatesForTheRowsItFinds). Not nothing either: in a drain
// every read fills the limit, and growing to it by append would make and
// copy twice the rows.
func readCap(limit int, last int64) int {
	limit = min(max(limit, 0), 10_000)
	return int(min(int64(limit), last+last/4+8))
}

func byRowID(a, b Row) int { return cmp.Compare(a.ID, b.ID) }

// sameText is raw as a string (NULL: ""), last when equal to it: a batch's
// rows mostly share their aggregate and event types, and a string made per
// row for each was two allocations a row.
func sameText(raw []byte, last string) string {
	if string(raw) == last {
		return last
	}
	return string(raw)
}

// readArgs are readSQL's arguments, and the per-row limit it applies.
func readArgs(lim FetchLimits, pos ReadPos) ([]any, int64) {
	rowBytes, budget := lim.RowBytes, lim.Bytes
	if rowBytes <= 0 || rowBytes > maxRowBytes {
		rowBytes = maxRowBytes
	}
	if budget <= 0 {
		budget = math.MaxInt64
	}
	span := pos.Span
	if span <= 0 {
		span = defaultSpan
	}
	holdIDs, horizons := make([]int64, len(pos.Holding)), make([]int64, len(pos.Holding))
	for i, g := range pos.Holding {
		holdIDs[i], horizons[i] = g.ID, int64(min(g.Horizon, math.MaxInt64))
	}
	pt, pa, pmin := make([]string, len(pos.Parked)), make([]string, len(pos.Parked)), make([]int64, len(pos.Parked))
	for i, p := range pos.Parked {
		pt[i], pa[i], pmin[i] = p.Type, p.ID, p.MinID
	}
	bt, ba := make([]string, len(lim.Busy)), make([]string, len(lim.Busy))
	for i, b := range lim.Busy {
		bt[i], ba[i] = b.Type, b.ID
	}
	watch := pos.Watch
	if watch == nil {
		watch = []int64{}
	}
	return []any{pos.Cursor, lim.Rows, max(pos.Frontier, pos.Cursor), span, watch,
		holdIDs, horizons, pt, pa, pmin, int8Array(lim.Skip), rowBytes, bt, ba, budget}, rowBytes
}

// epochSQL names the storage of the outbox table and its id sequence. Both
// get new storage when ids start again (TRUNCATE ... RESTART IDENTITY,
// ALTER TABLE ... ALTER COLUMN id RESTART, ALTER SEQUENCE ... RESTART), and
// on VACUUM FULL or CLUSTER, where starting afresh costs one cold start.
// setval() keeps the storage: a rewind by setval is found through the
// sequence's last value (seqLastSQL, poller/rewind.go) or by the rescan.
const epochSQL = `(SELECT ` + epochOfSQL + ` FROM ` + idSeqSQL + `)`

// epochOfSQL is epochSQL in a query that has idSeqSQL among its FROM items.
const epochOfSQL = `pg_relation_filenode('outbox'::regclass)::text || '/' || COALESCE(pg_relation_filenode(idseq.seq)::text, '')`

// idSeqSQL is a FROM item naming the outbox id sequence idseq.seq (NULL
// without one). OFFSET 0 keeps it one lookup (a pg_depend scan, 3 buffers)
// however often the query uses it; inlined, each use was a lookup.
const idSeqSQL = `(SELECT pg_get_serial_sequence('outbox', 'id')::regclass AS seq OFFSET 0) idseq`

// LoadCursor returns where a new holder's reads start: the cursor the last
// holder of lock saved (SaveCursor) in this epoch (ReadResult.Epoch), with
// the horizon saved beside it (0 unless that holder still owed its cold
// pass: a successor owes it in its place): one query. With none saved (a
// first start, or the first start after upgrading onto a table with
// history) it starts just below the lowest pending row, and at most a span
// (10,000 ids) below the highest id, so the first reads neither walk the
// settled history a span at a time (this one query walks it once per term
// instead) nor pass the ids producers in flight most likely hold: those
// are seen as gaps as usual. Such a cursor is not yet settled: an older id
// below it may belong to a producer transaction in progress when it was
// computed, so it comes with horizon, that snapshot's xmax; until a
// snapshot's xmin reaches it the caller keeps rescanning below the cursor.
//
// The lowest pending row is found by a bitmap scan of a pending index
// (pendingFloor), once per term that starts without a saved cursor: it
// reads every entry a snapshot held elsewhere keeps from vacuum, about 26
// buffers per 1,000 rows delivered under it (25.7k behind 1M here), and
// no bound is possible without a saved cursor. Written as min(id) in this
// query, the planner walked outbox_pending_aggregate_idx whole whenever
// its estimates saw few pending rows: a buffer per row (1.01M behind 1M;
// TestFirstStartCostsNoMoreThanABitmapOfThePendingIndex).
//
// sent is the highest id the earlier holders handed on (SaveCursor), at
// least cursor; with none known (no cursor saved, or saved before
// migration 00008) the table's highest id, which is at least as high.
func (s *Store) LoadCursor(ctx context.Context, lock string) (cursor, sent int64, horizon uint64, epoch string, err error) {
	var h int64
	var floor pgtype.Int8 // NULL: nothing pending
	for walked := false; ; walked = true {
		err = s.pool.QueryRow(ctx, loadCursorSQL, lock, int64(defaultSpan), floor).Scan(&cursor, &sent, &h, &epoch)
		if err != nil {
			return 0, 0, 0, "", wrap("load cursor", err)
		}
		if h == 0 || walked {
			return cursor, max(sent, cursor), uint64(max(h, 0)), epoch, nil
		}
		// None saved: find the lowest pending row (pendingFloor), then
		// load again, so that the horizon is of a snapshot taken after
		// that walk's.
		if floor, err = s.pendingFloor(ctx, loadFloorSQL); err != nil {
			return 0, 0, 0, "", err
		}
	}
}

// loadCursorSQL is LoadCursor's statement.
const loadCursorSQL = `SELECT COALESCE(saved.cursor, LEAST(
    COALESCE($3::bigint, top.id),
    GREATEST(top.id - $2, 0))),
  CASE WHEN saved.sent > 0 THEN GREATEST(saved.sent, saved.cursor) ELSE top.id END,
  CASE WHEN saved.cursor IS NULL THEN pg_snapshot_xmax(pg_current_snapshot())::text::bigint ELSE saved.horizon END,
  ` + epochSQL + `
FROM (SELECT (SELECT cursor FROM outbox_cursor WHERE lock_name = $1 AND epoch = ` + epochSQL + `) AS cursor,
    (SELECT sent FROM outbox_cursor WHERE lock_name = $1 AND epoch = ` + epochSQL + `) AS sent,
    (SELECT horizon FROM outbox_cursor WHERE lock_name = $1 AND epoch = ` + epochSQL + `) AS horizon) saved,
  (SELECT COALESCE((SELECT max(id) FROM outbox), 0) AS id) top`

// SaveCursor stores where f's holder stands, fenced: every id at or below
// cursor is delivered, dead or backing off, except that, while horizon is
// not 0, a producer in flight when the cursor was computed may still commit
// a row below it (the cold pass the holder owes, which LoadCursor hands to
// its successor); and no id above sent was handed on to a sink by this
// holder or the ones before it. A stale holder changes nothing
// (ErrStaleFence).
func (s *Store) SaveCursor(ctx context.Context, f Fence, cursor, sent int64, horizon uint64, epoch string) error {
	return s.fenced(ctx, f, saveCursorSQL, []*int64{new(int64)}, cursor, epoch, sent, int64(horizon))
}

const saveCursorSQL = fenceCTE + `,
saved AS (
  INSERT INTO outbox_cursor AS c (lock_name, cursor, epoch, sent, horizon) SELECT $1, $4, $5, $6, $7 WHERE EXISTS (SELECT 1 FROM fence)
  ON CONFLICT (lock_name) DO UPDATE SET cursor = EXCLUDED.cursor, epoch = EXCLUDED.epoch, sent = EXCLUDED.sent,
    horizon = EXCLUDED.horizon, updated_at = now()
  RETURNING 1)
SELECT EXISTS (SELECT 1 FROM fence), (SELECT count(*) FROM saved)`

// LaterSent returns, for each of rows (pending rows a new holder read at
// or below the sent mark its predecessors saved, LoadCursor), the highest
// id of its aggregate in (row, sent] that is already dispatched: the row
// committed after a later row of its aggregate was handed on by an earlier
// holder (a late commit). Rows with none are absent, and so are rows
// attempted or due later than written (a retry, a replayed dead row): a
// late commit is a row no holder has tried yet. One primary-key range
// walk over (lowest row id, sent]: no index covers dispatched rows by
// aggregate, and the range is the earlier holders' last few reads.
//
// The walk is one per call, whatever the plan: the dispatched rows'
// highest id per aggregate is taken over the range once and paired with
// the rows in Go. Joined in SQL (each row's own range (row, sent]), the
// plan Postgres made after ANALYZE saw the history scanned the range once
// per row: 438,793 buffers for 1,000 rows over 1,000 ids
// (TestHotPathPlansMadeOnASmallTableStayFlat).
//
// Rows at or above sent have no such id and are not looked up: the query
// for them alone was planned as a walk of the aggregates' whole history
// (104k buffers behind 1M settled rows under a held snapshot, at the first
// read of a holder that computed its cursor, LoadCursor).
func (s *Store) LaterSent(ctx context.Context, rows []Row, sent int64) (map[int64]int64, error) {
	return laterSent(ctx, s.pool, rows, sent)
}

// querier is what LaterSent needs of a pool or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// View is one read-only, repeatable-read view of the outbox: what was
// committed when View returned it, however long its user waits before
// asking. It holds a pooled connection until Close. Read-only, it holds no
// transaction id, so nothing waiting for the server-wide xmin (a cold pass)
// waits for it.
type View struct{ tx pgx.Tx }

// View takes a view of the outbox now (one round trip).
func (s *Store) View(ctx context.Context) (*View, error) {
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, wrap("view", err)
	}
	// A repeatable-read transaction's snapshot is taken by its first
	// statement, not by BEGIN.
	if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, wrap("view", err)
	}
	return &View{tx: tx}, nil
}

// LaterSent is Store.LaterSent as of the view.
func (v *View) LaterSent(ctx context.Context, rows []Row, sent int64) (map[int64]int64, error) {
	return laterSent(ctx, v.tx, rows, sent)
}

// Close ends the view and gives its connection back.
func (v *View) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = v.tx.Rollback(ctx)
}

func laterSent(ctx context.Context, db querier, rows []Row, sent int64) (map[int64]int64, error) {
	rows = slices.DeleteFunc(slices.Clone(rows), func(r Row) bool { return r.ID >= sent })
	if len(rows) == 0 {
		return nil, nil
	}
	ids, types, aggs := make([]int64, len(rows)), make([]string, len(rows)), make([]string, len(rows))
	lo := rows[0].ID
	for i, r := range rows {
		ids[i], types[i], aggs[i] = r.ID, r.AggregateType, r.AggregateID
		lo = min(lo, r.ID)
	}
	q, err := db.Query(ctx, laterSentSQL, ids, types, aggs, lo, sent)
	if err != nil {
		return nil, wrap("later sent", err)
	}
	// The pairing is done here, in maps: in SQL, each plan Postgres made
	// for it after an ANALYZE (a range scan per row, a nested loop over
	// the two lists) did work per pair of rows.
	type key struct{ t, a string }
	var kind, t, a string
	var id int64
	asked, last := map[int64]key{}, map[key]int64{}
	if _, err := pgx.ForEachRow(q, []any{&kind, &id, &t, &a}, func() error {
		if kind == "c" {
			asked[id] = key{t, a}
		} else {
			last[key{t, a}] = id
		}
		return nil
	}); err != nil {
		return nil, wrap("later sent", err)
	}
	out := map[int64]int64{}
	for id, k := range asked {
		if m, ok := last[k]; ok && m > id {
			out[id] = m
		}
	}
	return out, nil
}

// laterSentSQL: rows "c", the rows asked about that no holder tried yet;
// rows "o", per aggregate of theirs, the highest id dispatched in ($4, $5].
// The aggregate filter is a hashed subplan (NOT ... NOT IN keeps the
// planner from turning it into a join it could repeat per row).
const laterSentSQL = `WITH c AS MATERIALIZED (
  SELECT c.id, c.aggregate_type, c.aggregate_id
  FROM unnest($1::bigint[], $2::text[], $3::text[]) AS c(id, aggregate_type, aggregate_id)
  JOIN outbox r ON r.id = c.id AND r.attempts = 0 AND r.available_at <= r.created_at)
SELECT 'c', id, aggregate_type, aggregate_id FROM c
UNION ALL
SELECT 'o', max(o.id), o.aggregate_type, o.aggregate_id FROM outbox o
WHERE o.id > $4 AND o.id <= $5 AND o.dispatched_at IS NOT NULL
  AND NOT ((o.aggregate_type, o.aggregate_id) NOT IN (SELECT aggregate_type, aggregate_id FROM c))
GROUP BY o.aggregate_type, o.aggregate_id`

// Inherited is what a new holder knows, from one snapshot, of the rows in
// (lo, hi] (its loaded cursor, the sent mark): Late, the untried pending
// rows with a later row of their aggregate in (row, hi] already dispatched
// (row id -> the highest such id): each a late commit when taken; and
// Holes, the ids with no row visible then, as open intervals in id order,
// below the highest dispatched id of the range (an id above it can have no
// later dispatched row). A row taken later at an id in no hole was visible
// then or is above that, so Late settled it; only a row at a hole's id (a
// producer in flight at the snapshot) needs LaterSent.
type Inherited struct {
	Late  map[int64]int64
	Holes []Hole
}

// Hole is the ids strictly between After and Before.
type Hole struct{ After, Before int64 }

// InHole says whether id lies in one of h's holes (sorted, disjoint).
func (h *Inherited) InHole(id int64) bool {
	i, _ := slices.BinarySearchFunc(h.Holes, id, func(x Hole, id int64) int { return cmp.Compare(x.Before, id+1) })
	return i < len(h.Holes) && h.Holes[i].After < id
}

// InheritedLate reads what a new holder needs to check the rows it takes
// in (lo, hi] for late commits across the change of holder, in one
// statement: its cost is one walk of (lo, hi] (a hash of the aggregates
// dispatched there; below the highest of them, the pending rows of those
// aggregates and the ids missing: nothing more when none is dispatched),
// once a term, whatever the number of aggregates; the memory it returns is the
// late rows and the holes, not the aggregates. complete is false (and the
// answer nil) when either is more than limit.
//
// Not flat: the generic plan made on a small table finds the late rows
// through outbox_pending_aggregate_idx, whose pages hold every entry a
// snapshot held elsewhere keeps of the delivered history (426 -> 1,422
// buffers behind 20k -> 200k such rows, about 5.5 per 1,000; once a
// term). Written in the opaque COALESCE form that keeps the other
// statements off that index, the generic plan became a nested loop over
// the range per dispatched aggregate (772k buffers), so it is left so;
// TestHotPathPlansMadeOnASmallTableStayFlat bounds it as a once-a-term
// statement.
//
// It replaced DispatchedAbove, which held every aggregate dispatched in
// the range, in memory, up to 100,000 of them; with more (one event per
// order) each read fell back to a LaterSent walk up to the mark, and a
// backlog drain was quadratic again.
func (s *Store) InheritedLate(ctx context.Context, lo, hi int64, limit int) (in *Inherited, complete bool, err error) {
	rows, err := s.pool.Query(ctx, `WITH d AS MATERIALIZED (
  SELECT aggregate_type, aggregate_id, max(id) AS top FROM outbox
  WHERE id > $1 AND id <= $2 AND dispatched_at IS NOT NULL GROUP BY 1, 2),
reach AS (SELECT COALESCE(max(top), $1) AS id FROM d),
late AS (
  SELECT p.id, d.top FROM outbox p
  JOIN d ON d.aggregate_type = p.aggregate_type AND d.aggregate_id = p.aggregate_id AND d.top > p.id
  WHERE p.id > $1 AND p.id < (SELECT id FROM reach) AND p.dispatched_at IS NULL AND p.dead_at IS NULL
    AND p.attempts = 0 AND p.available_at <= p.created_at
  LIMIT $3),
holes AS (
  SELECT prev, id FROM (SELECT id, lag(id, 1, $1) OVER (ORDER BY id) AS prev FROM outbox WHERE id > $1 AND id < (SELECT id FROM reach)) s
  WHERE id > prev + 1 LIMIT $3),
tail AS (SELECT COALESCE(max(id), $1) AS id FROM outbox WHERE id > $1 AND id < (SELECT id FROM reach))
SELECT false, id, top FROM late
UNION ALL SELECT true, prev, id FROM holes
UNION ALL SELECT true, tail.id, reach.id FROM tail, reach WHERE tail.id + 1 < reach.id`, lo, hi, limit+1)
	if err != nil {
		return nil, false, wrap("inherited late", err)
	}
	in = &Inherited{Late: map[int64]int64{}}
	var hole bool
	var x, y int64
	if _, err := pgx.ForEachRow(rows, []any{&hole, &x, &y}, func() error {
		if hole {
			in.Holes = append(in.Holes, Hole{After: x, Before: y})
		} else {
			in.Late[x] = y
		}
		return nil
	}); err != nil {
		return nil, false, wrap("inherited late", err)
	}
	if len(in.Late) > limit || len(in.Holes) > limit+1 {
		return nil, false, nil
	}
	slices.SortFunc(in.Holes, func(a, b Hole) int { return cmp.Compare(a.After, b.After) })
	return in, true, nil
}

// PendingBetween returns the aggregates with pending rows not backing off
// in (lo, hi], each with its lowest such id: the poller's slow rescan below
// its cursor, for rows that re-entered the pending set there (an operator's
// UPDATE ... SET dispatched_at = NULL). Its cost is bounded by hi - lo.
func (s *Store) PendingBetween(ctx context.Context, lo, hi int64) ([]Parked, error) {
	rows, err := s.pool.Query(ctx, `SELECT aggregate_type, aggregate_id, min(id) FROM outbox
		WHERE dispatched_at IS NULL AND dead_at IS NULL AND available_at <= created_at AND id > $1 AND id <= $2
		GROUP BY 1, 2`, lo, hi)
	if err != nil {
		return nil, wrap("rescan", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Parked, error) {
		var p Parked
		err := r.Scan(&p.Type, &p.ID, &p.MinID)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: rescan: %w", err)
	}
	return out, nil
}
