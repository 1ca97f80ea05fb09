package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"

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
	// (epoch in cursor.sql): it changes when TRUNCATE or an id RESTART reuses ids,
	// and a cursor of the old ids means nothing then.
	Epoch string
	// Incarnation names the server the read ran on (incarnation in read.sql): it
	// changes on a failover, a restore started in place, or a restart.
	Incarnation string
	// SeqLast is the id sequence's last value (seq_last in read.sql), -1 when the
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

// readQ is read.sql's statement: the relay's read. Its text is the same
// for every call (pgx caches the prepared statement by text).
var readQ = stmt("read")

// Read is the relay's fetch (read.sql): the due rows to send within lim,
// read from pos, and what the poller needs to move pos on. Its cost depends
// on the rows above the cursor and the gaps and aggregates pos names, not on
// how many rows were delivered before.
func (s ReadPath) Read(ctx context.Context, lim FetchLimits, pos ReadPos) (ReadResult, error) {
	na, rowBytes := readArgs(lim, pos)
	res, err := readQ.query(ctx, s.db, na)
	if err != nil {
		return ReadResult{}, wrap("read", err)
	}
	defer res.Close()
	out := ReadResult{SeqLast: -1, Parked: map[Aggregate]int64{}, Rows: make([]Row, 0, readCap(lim.Rows, s.readRows.Load()))}
	// One row's columns, declared once and scanned into through one list
	// of destinations per kind: made per row, they would be allocations
	// per row.
	var x readRow
	dest := x.dests()
	for res.Next() {
		x.payload, x.hdrs = nil, nil // the row keeps its own: never reuse them
		raw := res.RawValues()       // text columns: their bytes are the text, binary or not
		d, ok := dest[string(raw[0])]
		if !ok {
			return ReadResult{}, errors.New("store: read: unexpected row kind " + strconv.Quote(string(raw[0])))
		}
		if err := res.Scan(d...); err != nil {
			return ReadResult{}, fmt.Errorf("store: read: %w", err)
		}
		x.typ, x.evt = sameText(raw[2], x.typ), sameText(raw[4], x.evt)
		if err := x.addTo(&out, rowBytes); err != nil {
			return ReadResult{}, err
		}
	}
	if err := res.Err(); err != nil {
		return ReadResult{}, wrap("read", err)
	}
	s.readRows.Store(int64(len(out.Rows)))
	// read.sql returns the rows read below the cursor after the hot ones.
	if !slices.IsSortedFunc(out.Rows, byRowID) {
		slices.SortFunc(out.Rows, byRowID)
	}
	return out, nil
}

// Row kinds of read.sql (its first column; its header has their table).
const (
	readKindRow      = "r" // a row to send
	readKindHot      = "h" // a hot row not returned, with its state
	readKindSnapshot = "s" // the snapshot's bounds, the epoch, the incarnation
	readKindSequence = "q" // the id sequence's last value
	readKindTop      = "c" // the highest id classified
	readKindGap      = "g" // a new gap
	readKindWatched  = "w" // a watched id visible now
	readKindParked   = "p" // a parked aggregate's first row
)

// readRow is one row of read.sql as scanned. The types are interned
// (sameText), not scanned.
type readRow struct {
	kind          string
	id            int64
	aid           pgtype.Text
	typ, evt      string
	payload, hdrs []byte
	created       pgtype.Timestamptz
	attempts      pgtype.Int4
	size          pgtype.Int8
	far           pgtype.Bool
	state         pgtype.Text
	pending       bool
	firstID       int64
	xmin, xmax    int64
	epoch         string
	incarnation   string
	seqLast       int64
	classified    int64
}

// dests are, per kind, the Scan destinations for x in read.sql's column
// order: the kind's columns, nil (not decoded) for the others, which it
// leaves NULL. aggregate_type and event_type are left to sameText.
func (x *readRow) dests() map[string][]any {
	cols := func(set ...any) []any {
		d := make([]any, 20)
		for i := 0; i < len(set); i += 2 {
			d[set[i].(int)] = set[i+1]
		}
		return d
	}
	return map[string][]any{
		readKindRow: cols(0, &x.kind, 1, &x.id, 3, &x.aid, 5, &x.payload, 6, &x.hdrs, 7, &x.created,
			8, &x.attempts, 9, &x.size, 10, &x.far),
		readKindHot:      cols(0, &x.kind, 1, &x.id, 3, &x.aid, 11, &x.state),
		readKindSnapshot: cols(0, &x.kind, 14, &x.xmin, 15, &x.xmax, 16, &x.epoch, 17, &x.incarnation),
		readKindSequence: cols(0, &x.kind, 18, &x.seqLast),
		readKindTop:      cols(0, &x.kind, 19, &x.classified),
		readKindGap:      cols(0, &x.kind, 1, &x.id),
		readKindWatched:  cols(0, &x.kind, 1, &x.id, 3, &x.aid, 12, &x.pending),
		readKindParked:   cols(0, &x.kind, 3, &x.aid, 13, &x.firstID),
	}
}

// addTo adds x to out by its kind.
func (x *readRow) addTo(out *ReadResult, rowBytes int64) error {
	agg := Aggregate{x.typ, x.aid.String}
	switch x.kind {
	case readKindRow:
		out.Rows = append(out.Rows, x.row(rowBytes))
	case readKindHot:
		st := byte(HotCut)
		if len(x.state.String) == 1 {
			st = x.state.String[0]
		}
		out.Hot = append(out.Hot, HotRow{ID: x.id, Aggregate: agg, State: st})
	case readKindSnapshot:
		out.XMin, out.XMax, out.Epoch, out.Incarnation = uint64(x.xmin), uint64(x.xmax), x.epoch, x.incarnation
	case readKindSequence:
		out.SeqLast = x.seqLast
	case readKindTop:
		out.Classified = x.classified
	case readKindGap:
		out.NewGaps = append(out.NewGaps, x.id)
	case readKindWatched:
		out.Visible = append(out.Visible, Watched{ID: x.id, Aggregate: agg, Pending: x.pending})
	case readKindParked:
		out.Parked[agg] = x.firstID
	default:
		return errors.New("store: read: unexpected row kind " + strconv.Quote(x.kind))
	}
	return nil
}

// row is x as a Row to send, poisoned when it cannot be sent as it is.
func (x *readRow) row(rowBytes int64) Row {
	r := Row{ID: x.id, AggregateType: x.typ, AggregateID: x.aid.String, EventType: x.evt,
		Payload: x.payload, Headers: x.hdrs, CreatedAt: x.created.Time, Attempts: int(x.attempts.Int32), Size: x.size.Int64}
	switch {
	case r.Size > rowBytes:
		r.Poison = fmt.Sprintf("row is %d bytes, above poller.max_payload_bytes (%d): not loaded, not sent", r.Size, rowBytes)
	case x.created.InfinityModifier != pgtype.Finite:
		r.Poison = "created_at is infinite: the event cannot be timestamped"
	case x.far.Bool:
		r.Poison = "available_at is more than 100 years ahead (or infinite): the event would block its aggregate for ever"
	}
	return r
}

// readCap is the room a read's rows start with: what the last read
// returned and a quarter more, within the limit. Not the limit itself:
// while events stream a read finds a few rows, and room for the limit made
// for each would be most of what the relay allocates
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
// row for each would be two allocations a row.
func sameText(raw []byte, last string) string {
	if string(raw) == last {
		return last
	}
	return string(raw)
}

// readArgs are read.sql's arguments, and the per-row limit it applies.
func readArgs(lim FetchLimits, pos ReadPos) (pgx.NamedArgs, int64) {
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
	return pgx.NamedArgs{
		"cursor": pos.Cursor, "rows": lim.Rows, "frontier": max(pos.Frontier, pos.Cursor), "span": span, "watch": watch,
		"holding_ids": holdIDs, "holding_horizons": horizons,
		"parked_types": pt, "parked_ids": pa, "parked_mins": pmin,
		"skip": int8Array(lim.Skip), "row_bytes": rowBytes, "busy_types": bt, "busy_ids": ba, "bytes": budget,
	}, rowBytes
}
