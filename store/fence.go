package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// Fence identifies a writer: the lock it holds, that lock's token, and the
// acquisition's owner value.
type Fence struct {
	Lock  string
	Token int64
	Owner string
}

// fenced runs a statement built on the fence fragment (fence.sql) whose
// final SELECT returns the fence's outcome first and then the write
// counts; ErrStaleFence when the fence refused. na gets the fence's
// @lock, @token and @owner.
func (s *core) fenced(ctx context.Context, f Fence, q query, counts []*int64, na pgx.NamedArgs) error {
	dest := make([]any, len(counts))
	for i, c := range counts {
		dest[i] = c
	}
	return s.fencedScan(ctx, f, q, dest, na)
}

// fencedScan is fenced with the write's results scanned into dest, of any
// type (the fence's outcome still comes first).
func (s *core) fencedScan(ctx context.Context, f Fence, q query, dest []any, na pgx.NamedArgs) error {
	if f.Token <= 0 {
		return fmt.Errorf("store: fenced write for %q without a token", f.Lock)
	}
	var ok bool
	dest = append([]any{&ok}, dest...)
	if na == nil {
		na = pgx.NamedArgs{}
	}
	na["lock"], na["token"], na["owner"] = f.Lock, f.Token, f.Owner
	if err := q.queryRow(ctx, s.db, na).Scan(dest...); err != nil {
		return fmt.Errorf("store: fenced write (%s token %d): %w", f.Lock, f.Token, err)
	}
	if !ok {
		return fmt.Errorf("%w: %s token %d", ErrStaleFence, f.Lock, f.Token)
	}
	return nil
}

// FenceToken returns the highest token Postgres has accepted for lock, 0 if
// none: the floor for the next acquisition.
func (s *Store) FenceToken(ctx context.Context, lock string) (int64, error) {
	var t int64
	err := fenceTokenQ.queryRow(ctx, s.db, pgx.NamedArgs{"lock": lock}).Scan(&t)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, wrap("read fence "+lock, err)
	}
	return t, nil
}

// FenceTokens returns every lock's accepted token.
func (s Ops) FenceTokens(ctx context.Context) (map[string]int64, error) {
	rows, err := fenceTokensQ.query(ctx, s.db, nil)
	if err != nil {
		return nil, wrap("read fences", err)
	}
	out := map[string]int64{}
	var name string
	var tok int64
	_, err = pgx.ForEachRow(rows, []any{&name, &tok}, func() error { out[name] = tok; return nil })
	if err != nil {
		return nil, fmt.Errorf("store: read fences: %w", err)
	}
	return out, nil
}

// ClaimFence raises the fence to f.Token before the holder acts, so a
// paused predecessor is refused from now on, and so that every token used
// anywhere is recorded as the floor for the next acquisition. It commits
// synchronously whatever the server's or connection's default (a raised
// fence must survive a crash; Complete relies on it).
func (s *Store) ClaimFence(ctx context.Context, f Fence) error {
	return s.fenced(ctx, f, claimFenceQ, nil, nil)
}

// Failure is one failed delivery's outcome.
type Failure struct {
	ID int64
	// CreatedAt is the row's created_at as read (zero: unknown, an
	// infinite one): as for Delivered, only a row that still has it is
	// written, so a row that took the id since gets no attempt from a
	// send it never had.
	CreatedAt time.Time
	Error     string // stored as last_error: made valid UTF-8 without NUL, cut to MaxErrorBytes
	// Delay is how long to wait before trying again, from the write's
	// now() on Postgres's clock (available_at = now() + Delay), never the
	// relay's: a relay whose clock is off would otherwise write an
	// available_at the reader, judging by created_at and now(), does not
	// take for a backoff. Ignored when Dead; a negative one is 0.
	Delay time.Duration
	Dead  bool // dead-letter now
	// Kind and Duration go to the row's attempt history (history.go): the
	// failure's kind (dispatch.FailureKind) and the send's duration, 0 when
	// unknown.
	Kind     string
	Duration time.Duration
}

// MaxErrorBytes bounds last_error.
const MaxErrorBytes = 1000

// The statements of fenced writes (fence.sql, complete.sql).
var (
	fenceTokenQ  = stmt("fence_token")
	fenceTokensQ = stmt("fence_tokens")
	claimFenceQ  = stmt("claim_fence")
	completeQ    = stmt("complete")
)

// Delivered is a row whose delivery Complete records. CreatedAt is its
// created_at as read: only a row that still has it is marked, so a row that
// took the same id since it was read (ids handed out again under the
// leader: a failover to a replica that lagged, a restore, setval) is not
// marked delivered without being sent.
type Delivered struct {
	ID        int64
	CreatedAt time.Time
}

// Complete writes a batch's outcome in one fenced statement: delivered rows
// get dispatched_at, failures bump attempts and get last_error plus either a
// new available_at (now() + Delay) or dead_at. Every instant it writes is
// Postgres's now(), whatever the relay's clock says. A negative attempts (an operator's edit)
// counts from 0, and the count stops at the largest int, so no stored value
// makes the write fail. The id sets must be disjoint. It returns how
// many rows each part changed (rows already delivered by someone are skipped).
//
// Durability: the write commits without waiting for the WAL flush or a
// synchronous standby (an fsync, during which the fence row would stay
// locked and the next batch's write would wait). A Postgres crash, or
// a failover to a standby, can therefore forget the last results (up to
// 3 × wal_writer_delay, 600 ms by default), never part of one: a
// transaction is all or nothing, and WAL order means only the newest are
// lost. That costs duplicates at most: a forgotten delivered row is fetched
// again, its idempotency key in Redis says delivered, and it is marked
// without being sent (sent again only if Redis lost the key too); a
// forgotten failure is retried. The fence is unaffected: ClaimFence, which
// raises it before a holder acts, always commits synchronously, and
// Complete only repeats that token.
//
// Isolation: one value Postgres refuses (a data exception) cannot hold back
// the rest of the batch. The statement is then split: the deliveries alone,
// then each failure alone; a failure still refused is stored with a
// last_error saying so and retried at once, so its attempts keep counting.
func (s ReadPath) Complete(ctx context.Context, f Fence, o Outcomes) (Completed, error) {
	d, n, err := s.completeIsolated(ctx, f, o.Delivered, o.Failures)
	return Completed{Delivered: d, Failed: n}, err
}

// MarkDelivered is Complete with deliveries alone: the rows the repair
// sweep finds delivered. It returns how many it marked.
func (s Reconcile) MarkDelivered(ctx context.Context, f Fence, delivered []Delivered) (int64, error) {
	d, _, err := s.completeIsolated(ctx, f, delivered, nil)
	return d, err
}

// Outcomes are a batch's results for Complete: the rows delivered and the
// rows that failed.
type Outcomes struct {
	Delivered []Delivered
	Failures  []Failure
}

// Completed counts the rows Complete changed.
type Completed struct {
	Delivered, Failed int64
}

// completeIsolated is Complete, with its isolation of a refused value.
func (s *core) completeIsolated(ctx context.Context, f Fence, delivered []Delivered, failures []Failure) (nDelivered, nFailed int64, err error) {
	if len(delivered) == 0 && len(failures) == 0 {
		return 0, 0, nil
	}
	clean := make([]Failure, len(failures))
	for i, x := range failures {
		x.Error = cleanText(x.Error, MaxErrorBytes)
		clean[i] = x
	}
	nDelivered, nFailed, err = s.complete(ctx, f, delivered, clean)
	if !isDataError(err) {
		return nDelivered, nFailed, err
	}
	if nDelivered, _, err = s.complete(ctx, f, delivered, nil); err != nil {
		return nDelivered, 0, err
	}
	nFailed = 0
	for _, x := range clean {
		_, n, err := s.complete(ctx, f, nil, []Failure{x})
		if isDataError(err) {
			x.Error = cleanText("outboxd could not store this failure ("+err.Error()+"); it was: "+x.Error, MaxErrorBytes)
			x.Delay = 0
			_, n, err = s.complete(ctx, f, nil, []Failure{x})
		}
		if err != nil {
			return nDelivered, nFailed, err
		}
		nFailed += n
	}
	return nDelivered, nFailed, nil
}

func (s *core) complete(ctx context.Context, f Fence, delivered []Delivered, failures []Failure) (nDelivered, nFailed int64, err error) {
	if len(delivered) == 0 && len(failures) == 0 {
		return 0, 0, nil
	}
	return s.completeWith(ctx, f, completeQ, delivered, failures, pgx.NamedArgs{})
}

// completeWith runs complete, or a statement built on it (q), with the
// batch's arguments added to na.
func (s *core) completeWith(ctx context.Context, f Fence, q query, delivered []Delivered, failures []Failure, na pgx.NamedArgs) (nDelivered, nFailed int64, err error) {
	n := len(failures)
	ids, errs, delay, dead := make([]int64, n), make([]string, n), make([]int64, n), make([]bool, n)
	made := make([]pgtype.Timestamptz, n) // NULL: unknown (infinite), by id alone
	for i, x := range failures {
		ids[i], errs[i], delay[i], dead[i] = x.ID, x.Error, max(x.Delay, 0).Microseconds(), x.Dead
		made[i] = pgtype.Timestamptz{Time: x.CreatedAt, Valid: !x.CreatedAt.IsZero()}
	}
	done, created := make([]int64, len(delivered)), make([]time.Time, len(delivered))
	for i, d := range delivered {
		done[i], created[i] = d.ID, d.CreatedAt
	}
	kinds, ms := attemptsOf(failures)
	na["delivered_ids"], na["delivered_created_at"] = int8Array(done), created
	na["failed_ids"], na["failed_errors"], na["failed_delay_us"], na["failed_dead"] = ids, errs, delay, dead
	na["failed_created_at"], na["failed_kinds"], na["failed_ms"] = made, kinds, ms
	err = s.fenced(ctx, f, q, []*int64{&nDelivered, &nFailed}, na)
	return nDelivered, nFailed, err
}

// isDataError: Postgres refused a value (SQLSTATE class 22, data exception),
// not the statement or the connection.
func isDataError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "22")
}

// cleanText makes s storable and readable as text: valid UTF-8 (invalid
// bytes become U+FFFD), no NUL (Postgres refuses it in text), at most max
// bytes, cut on a character boundary.
func cleanText(s string, max int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	if len(s) <= max {
		return s
	}
	cut := max - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
