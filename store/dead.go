package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// ErrNoRow: no outbox row has that id.
var ErrNoRow = errors.New("store: no such outbox row")

// ErrNotDead: the outbox row exists but is not dead-lettered.
var ErrNotDead = errors.New("store: outbox row is not dead-lettered")

// DeadFilter selects dead-lettered rows for listing, counting and replay;
// the zero value selects them all. Fields combine with AND.
type DeadFilter struct {
	IDs           []int64 // only these ids
	AggregateType string  // only this aggregate type
	AggregateID   string  // only this aggregate id (with AggregateType)
	// EventType is a glob over event_type: * matches any run of
	// characters, ? one character, \ makes the next one literal. Without
	// a wildcard it is an exact match.
	EventType string
	Since     time.Time // dead_at at or after this; zero: no bound
	Until     time.Time // dead_at before this; zero: no bound
	// SinceAgo and UntilAgo are Since and Until as durations before
	// Postgres's now() (--since 90m), measured on the clock that wrote
	// dead_at, not the caller's; zero: no bound.
	SinceAgo, UntilAgo time.Duration
	// Error is a substring of last_error, compared case-insensitively
	// (lower() of the database's LC_CTYPE: all of Unicode under a UTF-8
	// locale, ASCII only under "C").
	Error string
}

// ReplayFilter selects dead rows to requeue: the same filter as the list.
type ReplayFilter = DeadFilter

// filter returns the conditions selecting f's dead rows, each " AND "
// and one of dead.sql's dead_if_* fragments, for a statement's
// /* filter */, and their arguments added to na. Only the conditions set
// are written (see dead.sql).
func (f DeadFilter) filter(na pgx.NamedArgs) string {
	var b strings.Builder
	add := func(frag, name string, v any) {
		b.WriteString(" AND " + fragment(frag))
		na[name] = v
	}
	if len(f.IDs) > 0 {
		add("dead_if_ids", "ids", f.IDs)
	}
	if f.AggregateType != "" {
		add("dead_if_aggregate_type", "aggregate_type", f.AggregateType)
	}
	if f.AggregateID != "" {
		add("dead_if_aggregate_id", "aggregate_id", f.AggregateID)
	}
	if f.EventType != "" {
		if like, wild := globToLike(f.EventType); wild {
			add("dead_if_event_like", "event_type", like)
		} else {
			add("dead_if_event_type", "event_type", like)
		}
	}
	if !f.Since.IsZero() {
		add("dead_if_since", "since", f.Since)
	}
	if !f.Until.IsZero() {
		add("dead_if_until", "until", f.Until)
	}
	if f.SinceAgo > 0 {
		add("dead_if_since_ago", "since_ago_us", f.SinceAgo.Microseconds())
	}
	if f.UntilAgo > 0 {
		add("dead_if_until_ago", "until_ago_us", f.UntilAgo.Microseconds())
	}
	if f.Error != "" {
		// strpos, not ILIKE: the operator's text is literal, % and _ included.
		add("dead_if_error", "error", f.Error)
	}
	return b.String()
}

// globToLike turns a glob into a LIKE pattern (escape \). Without a
// wildcard it returns the literal text (escapes removed) and false.
func globToLike(g string) (string, bool) {
	var like, lit strings.Builder
	wild := false
	rs := []rune(g)
	for i := 0; i < len(rs); i++ {
		switch r := rs[i]; {
		case r == '\\' && i+1 < len(rs):
			i++
			like.WriteString(likeLiteral(rs[i]))
			lit.WriteRune(rs[i])
		case r == '*':
			wild = true
			like.WriteByte('%')
		case r == '?':
			wild = true
			like.WriteByte('_')
		default:
			like.WriteString(likeLiteral(r))
			lit.WriteRune(r)
		}
	}
	if !wild {
		return lit.String(), false
	}
	return like.String(), true
}

func likeLiteral(r rune) string {
	if r == '%' || r == '_' || r == '\\' {
		return `\` + string(r)
	}
	return string(r)
}

// DeadCursor is a position in the dead-letter list, which runs newest
// first: by dead_at, then id, both descending. A page continues strictly
// after it, so rows with equal dead_at are neither repeated nor skipped.
type DeadCursor struct {
	DeadAt pgtype.Timestamptz
	ID     int64
}

// String is the cursor as a token: dead_at in Unix microseconds (or
// infinity, -infinity), a dot, the id.
func (c DeadCursor) String() string {
	var at string
	switch c.DeadAt.InfinityModifier {
	case pgtype.Infinity:
		at = "infinity"
	case pgtype.NegativeInfinity:
		at = "-infinity"
	default:
		at = strconv.FormatInt(c.DeadAt.Time.UnixMicro(), 10)
	}
	return at + "." + strconv.FormatInt(c.ID, 10)
}

// ParseDeadCursor reads a token made by DeadCursor.String.
func ParseDeadCursor(s string) (DeadCursor, error) {
	at, id, ok := strings.Cut(s, ".")
	c := DeadCursor{DeadAt: pgtype.Timestamptz{Valid: true}}
	var err error
	if c.ID, err = strconv.ParseInt(id, 10, 64); !ok || err != nil {
		return c, fmt.Errorf("not a list cursor: %q", s)
	}
	switch at {
	case "infinity":
		c.DeadAt.InfinityModifier = pgtype.Infinity
	case "-infinity":
		c.DeadAt.InfinityModifier = pgtype.NegativeInfinity
	default:
		us, err := strconv.ParseInt(at, 10, 64)
		if err != nil {
			return c, fmt.Errorf("not a list cursor: %q", s)
		}
		c.DeadAt.Time = time.UnixMicro(us)
	}
	return c, nil
}

// DeadEvent is a dead-lettered row as operators see it. Timestamps are
// pgtype values: a row dead-lettered for an infinite created_at or
// available_at must show as such, not fail the list.
type DeadEvent struct {
	ID            int64              `json:"id"`
	AggregateType string             `json:"aggregate_type"`
	AggregateID   string             `json:"aggregate_id"`
	EventType     string             `json:"event_type"`
	Attempts      int                `json:"attempts"`
	LastError     string             `json:"last_error"`
	CreatedAt     pgtype.Timestamptz `json:"created_at"`
	AvailableAt   pgtype.Timestamptz `json:"available_at"`
	DeadAt        pgtype.Timestamptz `json:"dead_at"`
	// Payload and Headers are filled by ShowDead only.
	Payload json.RawMessage `json:"payload,omitempty"`
	Headers json.RawMessage `json:"headers,omitempty"`
}

// inUTC shows e's timestamps in UTC, whatever the process' zone.
func (e *DeadEvent) inUTC() {
	for _, t := range []*pgtype.Timestamptz{&e.CreatedAt, &e.AvailableAt, &e.DeadAt} {
		t.Time = t.Time.UTC()
	}
}

// Cursor is the position just after e.
func (e DeadEvent) Cursor() DeadCursor { return DeadCursor{DeadAt: e.DeadAt, ID: e.ID} }

// DeadPage is one page of the list.
type DeadPage struct {
	Events []DeadEvent `json:"events"`
	// Next continues the list (ListDead's after); empty on the last page.
	Next string `json:"next,omitempty"`
}

// MaxDeadPage bounds a page of the list.
const MaxDeadPage = 1000

// The statements of dead.sql.
var (
	deadListQ      = stmt("dead_list")
	deadListAfterQ = stmt("dead_list_after")
	deadCountQ     = stmt("dead_count")
	deadShowQ      = stmt("dead_show")
	deadReplayQ    = stmt("dead_replay")
	deadDiscardQ   = stmt("dead_discard")
)

// deadList is the list's statement for f and the cursor, and its
// arguments.
func deadList(f DeadFilter, after *DeadCursor, limit int) (query, pgx.NamedArgs) {
	na := pgx.NamedArgs{"limit": limit + 1}
	q := deadListQ
	if after != nil {
		q = deadListAfterQ
		na["before_at"], na["before_id"] = after.DeadAt, after.ID
	}
	return q.with(f.filter(na)), na
}

// DeadQuery asks ListDead for one page.
type DeadQuery struct {
	Filter DeadFilter
	// After is the cursor the page starts after (nil: from the start).
	After *DeadCursor
	// Limit is the page's size, clamped to [1, MaxDeadPage].
	Limit int
}

// ListDead returns up to p.Limit dead rows matching p.Filter, newest
// first, after p.After.
func (s Ops) ListDead(ctx context.Context, p DeadQuery) (DeadPage, error) {
	f, after, limit := p.Filter, p.After, p.Limit
	limit = min(max(limit, 1), MaxDeadPage)
	q, na := deadList(f, after, limit)
	rows, err := q.query(ctx, s.db, na)
	if err != nil {
		return DeadPage{}, wrap("list dead", err)
	}
	evs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadEvent, error) {
		var e DeadEvent
		err := r.Scan(&e.ID, &e.AggregateType, &e.AggregateID, &e.EventType, &e.Attempts, &e.LastError,
			&e.CreatedAt, &e.AvailableAt, &e.DeadAt)
		e.inUTC()
		return e, err
	})
	if err != nil {
		return DeadPage{}, wrap("list dead", err)
	}
	page := DeadPage{Events: evs}
	if len(evs) > limit {
		page.Events = evs[:limit]
		page.Next = evs[limit-1].Cursor().String()
	}
	return page, nil
}

// CountDead counts the dead rows matching f (what a replay would requeue).
func (s Ops) CountDead(ctx context.Context, f DeadFilter) (int64, error) {
	na := pgx.NamedArgs{}
	q := deadCountQ.with(f.filter(na))
	var n int64
	if err := q.queryRow(ctx, s.db, na).Scan(&n); err != nil {
		return 0, wrap("count dead", err)
	}
	return n, nil
}

// ShowDead returns one dead row with its payload and headers: ErrNoRow
// when there is none with that id, ErrNotDead (saying whether it is
// pending or delivered) when it is not dead-lettered.
func (s Ops) ShowDead(ctx context.Context, id int64) (DeadEvent, error) {
	var e DeadEvent
	var delivered pgtype.Timestamptz
	err := deadShowQ.queryRow(ctx, s.db, pgx.NamedArgs{"id": id}).
		Scan(&e.ID, &e.AggregateType, &e.AggregateID, &e.EventType, &e.Attempts, &e.LastError,
			&e.CreatedAt, &e.AvailableAt, &e.DeadAt, (*[]byte)(&e.Payload), (*[]byte)(&e.Headers), &delivered)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return e, fmt.Errorf("%w: id %d", ErrNoRow, id)
	case err != nil:
		return e, wrap("show dead", err)
	case e.DeadAt.Valid:
		e.inUTC()
		return e, nil
	case delivered.Valid:
		return e, fmt.Errorf("%w: id %d was delivered at %s", ErrNotDead, id, delivered.Time.UTC().Format(time.RFC3339))
	default:
		return e, fmt.Errorf("%w: id %d is pending (attempts %d)", ErrNotDead, id, e.Attempts)
	}
}

// Replay says which dead rows ReplayDead requeues, and how.
type Replay struct {
	Filter    ReplayFilter
	BatchSize int // rows per statement (<= 0: 1000)
	// Progress, if not nil, is called after each batch with the rows
	// requeued so far.
	Progress func(done int64)
}

// ReplayDead requeues the dead rows p.Filter selects (clears dead_at,
// resets attempts, due now; last_error stays for the record) in batches of
// p.BatchSize, calling p.Progress after each. The rows' attempt history
// stays and gains an entry of kind "replay"; the failures after it are
// numbered after that entry.
//
// Replays are fenced writes like every other: each batch is one statement
// under fence (the holder of lock:reconciliation, which purges dead rows),
// so a replay whose term was taken over changes nothing more: it returns
// how many rows it requeued before, and ErrStaleFence.
func (s Reconcile) ReplayDead(ctx context.Context, fence Fence, p Replay) (int64, error) {
	f, batchSize, progress := p.Filter, p.BatchSize, p.Progress
	na := pgx.NamedArgs{}
	q := deadReplayQ.with(f.filter(na))
	var total, marked int64
	return s.deadBatches(ctx, fence, "replay", q, na, batchSize, []any{&marked}, func(n int64) {
		total += n
		if progress != nil && n > 0 {
			progress(total)
		}
	})
}

// deadBatches runs a fenced batch statement over dead rows (dead_replay,
// dead_discard, with na the filter's arguments: after the fence's outcome it returns the batch's count, its
// last row's dead_at and id, then extra) from before every row, each batch
// after the last row of the one before, until a batch comes back short.
// each is called after every batch with its count (extra scanned). It
// returns the total, also when a batch failed.
func (s *core) deadBatches(ctx context.Context, fence Fence, op string, q query, na pgx.NamedArgs, batchSize int, extra []any, each func(n int64)) (int64, error) {
	if batchSize <= 0 {
		batchSize = 1000
	}
	// From before every row: ids are bigint, dead_at can be -infinity.
	cursor := DeadCursor{DeadAt: pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}, ID: math.MinInt64}
	na["batch"] = batchSize
	var total int64
	for {
		na["after_at"], na["after_id"] = cursor.DeadAt, cursor.ID
		var n int64
		var last DeadCursor
		if err := s.fencedScan(ctx, fence, q, append([]any{&n, &last.DeadAt, &last.ID}, extra...), na); err != nil {
			return total, wrap(op, err)
		}
		if n > 0 && last.after(cursor) {
			cursor = last
		}
		total += n
		each(n)
		if n < int64(batchSize) {
			return total, nil
		}
	}
}

// after orders cursors as the list's index does (dead_at, then id).
func (c DeadCursor) after(o DeadCursor) bool {
	if c.DeadAt.InfinityModifier != o.DeadAt.InfinityModifier {
		return c.DeadAt.InfinityModifier > o.DeadAt.InfinityModifier
	}
	if c.DeadAt.InfinityModifier == pgtype.Finite && !c.DeadAt.Time.Equal(o.DeadAt.Time) {
		return c.DeadAt.Time.After(o.DeadAt.Time)
	}
	return c.ID > o.ID
}
