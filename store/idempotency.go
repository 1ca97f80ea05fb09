package store

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// Idempotency keys in Postgres (idempotency.store: postgres): the table
// outbox_idempotency holds, per outbox id, what Redis holds at
// idempotency:notify:<outbox_id> otherwise, the same values under the
// same rules (idempotency.sql), judged on Postgres' clock.
//
// Guarantee: a claim is written only where no live value is (ClaimKeys),
// replaced only by compare-and-set on the value seen (TakeOverKeys), and
// turned into a delivered mark, or dropped, only while it is still the
// writer's own (Settle): a newer holder's claim is never overwritten by
// an older one. The marks ride the batch's fenced write of its outcome
// (CompleteSettled): no round trip of their own.

// KeyClaim is what ClaimKeys found on one key.
type KeyClaim struct {
	// Found is the value of a live key, left as it was; "" when there was
	// none.
	Found string
	// Ours: our claim was written. Neither Ours nor a Found means another
	// writer claimed the key meanwhile.
	Ours bool
}

// Settle is what the end of a batch does to its keys: each of MarkIDs gets
// its delivered mark (Marks, same order) where it holds Claim or nothing
// live, each of ReleaseIDs is deleted where it holds Claim.
type Settle struct {
	Claim      string
	MarkIDs    []int64
	Marks      []string
	MarkTTL    time.Duration
	ReleaseIDs []int64
}

func (k Settle) empty() bool { return len(k.MarkIDs) == 0 && len(k.ReleaseIDs) == 0 }

func (k Settle) args(na pgx.NamedArgs) pgx.NamedArgs {
	na["mark_ids"], na["marks"], na["mark_ttl_ms"] = nonNil(k.MarkIDs), nonNil(k.Marks), k.MarkTTL.Milliseconds()
	na["release_ids"], na["claim"] = nonNil(k.ReleaseIDs), k.Claim
	return na
}

// nonNil is s, or an empty slice for nil (pgx sends nil as NULL, and
// unnest(NULL) fails to find its type).
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// The statements of idempotency.sql, and complete with the settle
// fragment beside its writes.
var (
	idempotencyClaimQ    = stmt("idempotency_claim")
	idempotencyTakeOverQ = stmt("idempotency_take_over")
	idempotencySettleQ   = stmt("idempotency_settle")
	idempotencyValuesQ   = stmt("idempotency_values")
	idempotencyPurgeQ    = stmt("idempotency_purge")
	completeSettledQ     = withSettle(completeQ)
)

// settleParams are the idempotency_settle fragment's parameters, in its
// header's order.
var settleParams = []string{"mark_ids", "marks", "mark_ttl_ms", "release_ids", "claim"}

// withSettle is q (complete) with the idempotency_settle fragment's parts
// added to its WITH list, before its final SELECT. It panics at load if q
// has no such SELECT: TestIdempotencyStatements compiles it.
func withSettle(q query) query {
	const final = "\nSELECT EXISTS (SELECT 1 FROM fence)"
	i := strings.LastIndex(q.text, final)
	if i < 0 {
		panic("store: " + q.name + " has no final SELECT of the fence")
	}
	text := q.text[:i] + ",\n" + fragment("idempotency_settle") + q.text[i:]
	c, err := compile(q.name+"_settled", text, append(slices.Clone(q.header), settleParams...))
	if err != nil {
		panic(err)
	}
	return c
}

// ClaimKeys claims the keys of ids for value, for ttl, where no live value
// is; the answer is in ids order.
func (s ReadPath) ClaimKeys(ctx context.Context, ids []int64, value string, ttl time.Duration) ([]KeyClaim, error) {
	rows, err := idempotencyClaimQ.query(ctx, s.db, pgx.NamedArgs{"ids": ids, "value": value, "ttl_ms": ttl.Milliseconds()})
	if err != nil {
		return nil, wrap("claim idempotency keys", err)
	}
	// The statement answers only for the keys it did not claim.
	notOurs := make(map[int64]string)
	var id int64
	var found pgtype.Text
	_, err = pgx.ForEachRow(rows, []any{&id, &found}, func() error {
		notOurs[id] = found.String
		return nil
	})
	if err != nil {
		return nil, wrap("claim idempotency keys", err)
	}
	out := make([]KeyClaim, len(ids))
	for i, id := range ids {
		if v, ok := notOurs[id]; ok {
			out[i] = KeyClaim{Found: v}
		} else {
			out[i] = KeyClaim{Ours: true}
		}
	}
	return out, nil
}

// TakeOver answers of TakeOverKeys, per key.
const (
	KeyChanged   = 0 // the key changed otherwise: left alone
	KeyTaken     = 1 // it holds our claim now
	KeyDelivered = 2 // it holds the row's delivered mark
)

// TakeOverKeys replaces, key by key, the value previous[i] seen on ids[i]
// with our claim value for ttl, only if the key still holds it; marks[i]
// is the row's delivered mark. The answer is in ids order.
func (s ReadPath) TakeOverKeys(ctx context.Context, ids []int64, previous, marks []string, value string, ttl time.Duration) ([]int, error) {
	rows, err := idempotencyTakeOverQ.query(ctx, s.db, pgx.NamedArgs{
		"ids": ids, "previous": previous, "marks": marks, "value": value, "ttl_ms": ttl.Milliseconds(),
	})
	if err != nil {
		return nil, wrap("take over idempotency keys", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil, wrap("take over idempotency keys", err)
	}
	return out, nil
}

// CompleteSettled is Complete with k written in the same statement: the
// keys change whether or not the fence accepts the outcome (see Settle).
// When the statement is split (a data exception, see Complete), the keys
// are settled first, on their own.
func (s ReadPath) CompleteSettled(ctx context.Context, f Fence, o Outcomes, k Settle) (Completed, error) {
	if k.empty() {
		return s.Complete(ctx, f, o)
	}
	clean := make([]Failure, len(o.Failures))
	for i, x := range o.Failures {
		x.Error = cleanText(x.Error, MaxErrorBytes)
		clean[i] = x
	}
	d, n, err := s.completeWith(ctx, f, completeSettledQ, o.Delivered, clean, k.args(pgx.NamedArgs{}))
	if !isDataError(err) {
		return Completed{Delivered: d, Failed: n}, err
	}
	if err := s.settleKeys(ctx, k); err != nil {
		return Completed{}, err
	}
	return s.Complete(ctx, f, o)
}

// settleKeys writes k alone (CompleteSettled's split path).
func (s ReadPath) settleKeys(ctx context.Context, k Settle) error {
	var n int64
	if err := idempotencySettleQ.queryRow(ctx, s.db, k.args(pgx.NamedArgs{})).Scan(&n); err != nil {
		return wrap("settle idempotency keys", err)
	}
	return nil
}

// KeyValues returns what the live keys of ids hold, by id.
func (s Reconcile) KeyValues(ctx context.Context, ids []int64) (map[int64]string, error) {
	rows, err := idempotencyValuesQ.query(ctx, s.db, pgx.NamedArgs{"ids": ids})
	if err != nil {
		return nil, wrap("read idempotency keys", err)
	}
	out := make(map[int64]string, len(ids))
	var id int64
	var v string
	_, err = pgx.ForEachRow(rows, []any{&id, &v}, func() error { out[id] = v; return nil })
	if err != nil {
		return nil, wrap("read idempotency keys", err)
	}
	return out, nil
}

// KeyPurge is what one window of PurgeKeys did.
type KeyPurge struct {
	Deleted int64 // expired keys deleted
	Last    int64 // the last id scanned: the next window starts after it
	More    bool  // the window was full and held an expired key: go on
}

// PurgeKeys deletes the expired keys among the next scan keys after the
// id after, in id order, fenced.
func (s Reconcile) PurgeKeys(ctx context.Context, f Fence, after int64, scan int) (KeyPurge, error) {
	var p KeyPurge
	err := s.fencedScan(ctx, f, idempotencyPurgeQ, []any{&p.Deleted, &p.Last, &p.More}, pgx.NamedArgs{"after": after, "scan": scan})
	return p, err
}
