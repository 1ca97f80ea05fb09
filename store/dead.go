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

// where returns the WHERE clause selecting f's dead rows, with its
// arguments appended to args. Only the conditions set are written: under
// force_generic_plan (see OpenConfig) a catch-all form ($1 IS NULL OR column = $1) would
// get one plan for every shape, and a bad one for most.
func (f DeadFilter) where(args []any) (string, []any) {
	conds := []string{"dead_at IS NOT NULL"}
	add := func(cond string, v any) {
		args = append(args, v)
		conds = append(conds, strings.ReplaceAll(cond, "$?", "$"+strconv.Itoa(len(args))))
	}
	if len(f.IDs) > 0 {
		add("id = ANY($?::bigint[])", f.IDs)
	}
	if f.AggregateType != "" {
		add("aggregate_type = $?", f.AggregateType)
	}
	if f.AggregateID != "" {
		add("aggregate_id = $?", f.AggregateID)
	}
	if f.EventType != "" {
		if like, wild := globToLike(f.EventType); wild {
			add(`event_type LIKE $? ESCAPE '\'`, like)
		} else {
			add("event_type = $?", like)
		}
	}
	if !f.Since.IsZero() {
		add("dead_at >= $?", f.Since)
	}
	if !f.Until.IsZero() {
		add("dead_at < $?", f.Until)
	}
	if f.SinceAgo > 0 {
		add("dead_at >= now() - $?::bigint * interval '1 microsecond'", f.SinceAgo.Microseconds())
	}
	if f.UntilAgo > 0 {
		add("dead_at < now() - $?::bigint * interval '1 microsecond'", f.UntilAgo.Microseconds())
	}
	if f.Error != "" {
		// strpos, not ILIKE: the operator's text is literal, % and _ included.
		add("strpos(lower(last_error), lower($?)) > 0", f.Error)
	}
	return strings.Join(conds, " AND "), args
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

const deadColumns = `id, aggregate_type, aggregate_id, event_type, attempts, COALESCE(last_error, ''),
  created_at, available_at, dead_at`

// deadListSQL returns the list's statement and arguments. It walks
// outbox_dead_list_idx (dead_at, id) backwards from the cursor, so a page
// reads its own rows (and the ones the filter drops), never the pages
// before it.
func deadListSQL(f DeadFilter, after *DeadCursor, limit int) (string, []any) {
	args := []any{limit + 1}
	where, args := f.where(args)
	if after != nil {
		args = append(args, after.DeadAt, after.ID)
		where += fmt.Sprintf(" AND (dead_at, id) < ($%d::timestamptz, $%d::bigint)", len(args)-1, len(args))
	}
	return `SELECT ` + deadColumns + ` FROM outbox WHERE ` + where + `
ORDER BY dead_at DESC, id DESC LIMIT $1`, args
}

// ListDead returns up to limit dead rows matching f, newest first, after
// the cursor (nil: from the start). limit is clamped to [1, MaxDeadPage].
func (s *Store) ListDead(ctx context.Context, f DeadFilter, after *DeadCursor, limit int) (DeadPage, error) {
	limit = min(max(limit, 1), MaxDeadPage)
	sql, args := deadListSQL(f, after, limit)
	rows, err := s.db.Query(ctx, sql, args...)
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
func (s *Store) CountDead(ctx context.Context, f DeadFilter) (int64, error) {
	where, args := f.where(nil)
	var n int64
	if err := s.db.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE `+where, args...).Scan(&n); err != nil {
		return 0, wrap("count dead", err)
	}
	return n, nil
}

// ShowDead returns one dead row with its payload and headers: ErrNoRow
// when there is none with that id, ErrNotDead (saying whether it is
// pending or delivered) when it is not dead-lettered.
func (s *Store) ShowDead(ctx context.Context, id int64) (DeadEvent, error) {
	var e DeadEvent
	var delivered pgtype.Timestamptz
	err := s.db.QueryRow(ctx, `SELECT `+deadColumns+`, payload, headers, dispatched_at FROM outbox WHERE id = $1`, id).
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

// replaySQL requeues the next batch of f's dead rows after the cursor
// ($4, $5: dead_at, id), at most $6, walking outbox_dead_list_idx like the
// list (in the other direction), as one fenced statement (fenceCTE: $1..$3).
// The rows are locked (SKIP LOCKED: a row another replay or a purge holds
// is left to it) and the UPDATE re-checks dead_at, so a row that stopped
// being dead meanwhile is not touched. It returns the fence's outcome, how
// many rows it requeued and the last of them (dead_at, id) as the next
// cursor.
func replaySQL(f DeadFilter) (string, []any) {
	picked, args := pickDeadSQL(f)
	return fenceCTE + `,
` + picked + `,
requeued AS (
  UPDATE outbox o SET dead_at = NULL, attempts = 0, available_at = now()
  FROM picked WHERE o.id = picked.id AND o.dead_at IS NOT NULL AND EXISTS (SELECT 1 FROM fence)
  RETURNING o.id, picked.dead_at),
last AS (SELECT dead_at, id FROM requeued ORDER BY dead_at DESC, id DESC LIMIT 1)
SELECT EXISTS (SELECT 1 FROM fence), (SELECT count(*) FROM requeued),
  (SELECT dead_at FROM last), COALESCE((SELECT id FROM last), 0)`, args
}

// pickDeadSQL is the CTE "picked" of a fenced batch over dead rows
// (replaySQL, discardSQL): the next batch of f's dead rows after the
// cursor ($4, $5: dead_at, id), at most $6, oldest first along
// outbox_dead_list_idx, locked (SKIP LOCKED: a row another replay, discard
// or purge holds is left to it), picked only under the fence (fenceCTE:
// $1..$3). args are the statement's arguments from $4 on ($4..$6 left to
// the caller), then the filter's.
func pickDeadSQL(f DeadFilter) (string, []any) {
	where, args := f.where(make([]any, 6))
	return `picked AS (
  SELECT id, dead_at FROM outbox
  WHERE ` + where + ` AND (dead_at, id) > ($4::timestamptz, $5::bigint) AND EXISTS (SELECT 1 FROM fence)
  ORDER BY dead_at, id LIMIT $6
  FOR UPDATE SKIP LOCKED)`, args[3:]
}

// ReplayDead requeues dead rows (clears dead_at, resets attempts, due now;
// last_error stays for the record) in batches of batchSize, calling progress
// after each.
//
// Replays are fenced writes like every other: each batch is one statement
// under fence (the holder of lock:reconciliation, which purges dead rows),
// so a replay whose term was taken over changes nothing more: it returns
// how many rows it requeued before, and ErrStaleFence.
func (s *Store) ReplayDead(ctx context.Context, fence Fence, f ReplayFilter, batchSize int, progress func(done int64)) (int64, error) {
	sql, args := replaySQL(f)
	var total int64
	return s.deadBatches(ctx, fence, "replay", sql, args, batchSize, nil, func(n int64) {
		total += n
		if progress != nil && n > 0 {
			progress(total)
		}
	})
}

// deadBatches runs a fenced batch statement over dead rows (replaySQL,
// discardSQL: after the fence's outcome it returns the batch's count, its
// last row's dead_at and id, then extra) from before every row, each batch
// after the last row of the one before, until a batch comes back short.
// each is called after every batch with its count (extra scanned). It
// returns the total, also when a batch failed.
func (s *Store) deadBatches(ctx context.Context, fence Fence, op, sql string, args []any, batchSize int, extra []any, each func(n int64)) (int64, error) {
	if batchSize <= 0 {
		batchSize = 1000
	}
	// From before every row: ids are bigint, dead_at can be -infinity.
	cursor := DeadCursor{DeadAt: pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}, ID: math.MinInt64}
	args[2] = batchSize
	var total int64
	for {
		args[0], args[1] = cursor.DeadAt, cursor.ID
		var n int64
		var last DeadCursor
		if err := s.fencedScan(ctx, fence, sql, append([]any{&n, &last.DeadAt, &last.ID}, extra...), args...); err != nil {
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
