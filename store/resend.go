package store

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// HeaderResentFrom is the header a resent copy carries: the id of the
// delivered row it copies. It is an entry of the copy's headers object, so
// every broker sink passes it on as a message header, and the webhook sink
// sends it as Outbox-Resent-From.
const HeaderResentFrom = "outbox-resent-from"

// ResendFilter selects delivered rows to send again; the zero value selects
// them all. Fields combine with AND.
type ResendFilter struct {
	IDs           []int64 // only these ids
	FromID, ToID  int64   // id at least / at most this; 0: no bound
	AggregateType string
	AggregateID   string // with AggregateType
	EventType     string // a glob, as DeadFilter's
	// Dispatched: Since and Until bound dispatched_at; otherwise created_at.
	Dispatched         bool
	Since, Until       time.Time
	SinceAgo, UntilAgo time.Duration
	// Error is a substring of an entry of the row's attempt history (a
	// failure before it was delivered), case-insensitive.
	Error string
	// Kinds, when not empty, are the only (aggregate_type, event_type)
	// pairs selected: those routed to one destination (ResendKinds).
	Kinds []EventKind
}

// EventKind is an aggregate type and an event type: what the routes
// choose a destination by.
type EventKind struct {
	AggregateType string `json:"aggregate_type"`
	EventType     string `json:"event_type"`
}

// IsZero: f selects every delivered row.
func (f ResendFilter) IsZero() bool {
	return len(f.IDs) == 0 && f.FromID == 0 && f.ToID == 0 && f.AggregateType == "" && f.AggregateID == "" &&
		f.EventType == "" && f.Since.IsZero() && f.Until.IsZero() && f.SinceAgo == 0 && f.UntilAgo == 0 && f.Error == "" &&
		len(f.Kinds) == 0
}

// filter returns the conditions selecting f's rows (resend.sql's
// resend_if_* fragments) and their arguments added to na.
func (f ResendFilter) filter(na pgx.NamedArgs) string {
	var b strings.Builder
	add := func(frag, name string, v any) {
		b.WriteString(" AND " + fragment(frag))
		na[name] = v
	}
	col := "created"
	if f.Dispatched {
		col = "dispatched"
	}
	if len(f.IDs) > 0 {
		add("resend_if_ids", "ids", f.IDs)
	}
	if f.FromID != 0 {
		add("resend_if_from_id", "from_id", f.FromID)
	}
	if f.ToID != 0 {
		add("resend_if_to_id", "to_id", f.ToID)
	}
	if f.AggregateType != "" {
		add("resend_if_aggregate_type", "aggregate_type", f.AggregateType)
	}
	if f.AggregateID != "" {
		add("resend_if_aggregate_id", "aggregate_id", f.AggregateID)
	}
	if f.EventType != "" {
		if like, wild := globToLike(f.EventType); wild {
			add("resend_if_event_like", "event_type", like)
		} else {
			add("resend_if_event_type", "event_type", like)
		}
	}
	if !f.Since.IsZero() {
		add("resend_if_"+col+"_since", "since", f.Since)
	}
	if !f.Until.IsZero() {
		add("resend_if_"+col+"_until", "until", f.Until)
	}
	if f.SinceAgo > 0 {
		add("resend_if_"+col+"_since_ago", "since_ago_us", f.SinceAgo.Microseconds())
	}
	if f.UntilAgo > 0 {
		add("resend_if_"+col+"_until_ago", "until_ago_us", f.UntilAgo.Microseconds())
	}
	if f.Error != "" {
		add("resend_if_error", "error", f.Error)
	}
	return b.String() + f.kindsFilter(na)
}

// kindsFilter is the condition selecting f.Kinds' pairs (resend_if_kinds)
// with its arguments added to na; "" when f has none.
func (f ResendFilter) kindsFilter(na pgx.NamedArgs) string {
	if len(f.Kinds) == 0 {
		return ""
	}
	ats, ets := make([]string, len(f.Kinds)), make([]string, len(f.Kinds))
	for i, k := range f.Kinds {
		ats[i], ets[i] = k.AggregateType, k.EventType
	}
	na["kind_aggregate_types"], na["kind_event_types"] = ats, ets
	return " AND " + fragment("resend_if_kinds")
}

// ResentCopy is one resent row: the original's id and its copy's.
type ResentCopy struct {
	ID   int64 `json:"id"`
	Copy int64 `json:"copy"`
}

// The statements of resend.sql.
var (
	resendQ        = stmt("resend")
	resendCountQ   = stmt("resend_count")
	resendMissingQ = stmt("resend_missing")
	resendKindsQ   = stmt("resend_kinds")
)

// ResendKinds returns the distinct (aggregate_type, event_type) pairs of
// the delivered rows f selects, in order: a resend to one destination
// keeps the pairs the routes send there (ResendFilter.Kinds).
func (s Ops) ResendKinds(ctx context.Context, f ResendFilter) ([]EventKind, error) {
	na := pgx.NamedArgs{}
	rows, err := resendKindsQ.with(f.filter(na)).query(ctx, s.db, na)
	if err != nil {
		return nil, wrap("resend kinds", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[EventKind])
	if err != nil {
		return nil, wrap("resend kinds", err)
	}
	return out, nil
}

// CountResend counts the delivered rows f selects, at most limit (0: no
// bound): what a resend would copy.
func (s Ops) CountResend(ctx context.Context, f ResendFilter, limit int) (int64, error) {
	na := pgx.NamedArgs{}
	var n int64
	if err := resendCountQ.with(f.filter(na)).queryRow(ctx, s.db, na).Scan(&n); err != nil {
		return 0, wrap("count resend", err)
	}
	if limit > 0 {
		n = min(n, int64(limit))
	}
	return n, nil
}

// MissingRows returns which of ids have no outbox row at all (purged past
// retention, discarded, or never written), ascending.
func (s Ops) MissingRows(ctx context.Context, ids []int64) ([]int64, error) {
	out := []int64{}
	if len(ids) == 0 {
		return out, nil
	}
	rows, err := resendMissingQ.query(ctx, s.db, pgx.NamedArgs{"ids": ids})
	if err != nil {
		return nil, wrap("missing rows", err)
	}
	ids, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, wrap("missing rows", err)
	}
	return append(out, ids...), nil
}

// ResendBatch says which delivered rows Resend copies, and how.
type ResendBatch struct {
	Filter    ResendFilter
	Limit     int // at most this many copies (0: no bound)
	BatchSize int // rows per statement (<= 0: 1000)
	// Copied, if not nil, gets each batch's pairs (original, copy).
	Copied func([]ResentCopy)
}

// Resend copies the delivered rows p.Filter selects, oldest first and at
// most p.Limit, as new pending rows (resend.sql), in batches of
// p.BatchSize, each one fenced statement; p.Copied gets each batch's pairs.
//
// A copy is a row of its own: a new id, behind every row already written,
// so the relay delivers it through the normal path in its aggregate's
// order, and the original's idempotency mark (which names the original's
// id) does not hold it back. A resend whose term was taken over copies
// nothing more: it returns how many it copied before, and ErrStaleFence.
func (s Reconcile) Resend(ctx context.Context, fence Fence, p ResendBatch) (int64, error) {
	f, limit, batchSize, copied := p.Filter, p.Limit, p.BatchSize, p.Copied
	if batchSize <= 0 {
		batchSize = 1000
	}
	na := pgx.NamedArgs{}
	q := resendQ.with(f.filter(na))
	var total, after int64
	for limit <= 0 || total < int64(limit) {
		batch := batchSize
		if limit > 0 {
			batch = int(min(int64(batchSize), int64(limit)-total))
		}
		na["after_id"], na["batch"] = after, batch
		var n, last, marked int64
		var pairs []byte
		if err := s.fencedScan(ctx, fence, q, []any{&n, &last, &pairs, &marked}, na); err != nil {
			return total, wrap("resend", err)
		}
		var cs []ResentCopy
		if err := json.Unmarshal(pairs, &cs); err != nil {
			return total, wrap("resend", err)
		}
		total += n
		if copied != nil && n > 0 {
			copied(cs)
		}
		if n < int64(batch) {
			break
		}
		after = last
	}
	return total, nil
}
