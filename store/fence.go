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

// fenceCTE locks the lock's fence row and raises it to the writer's token, or
// returns no row when Postgres already accepted a higher token, or the same
// token from another owner. Every fenced statement starts with it and guards
// its write with EXISTS (SELECT 1 FROM fence).
//
// The row is written only to raise it (the first write of a term): a
// holder's later writes carry the token already there and only lock the
// row (FOR UPDATE writes no new row version). Updating it on every write,
// as an upsert would, leaves one dead version per batch that a snapshot
// held elsewhere keeps from vacuum, and every later write would walk them
// all to find the live one, at a cost growing without bound.
// A writer that waits for the lock sees the row as its holder left it
// (READ COMMITTED re-reads a locked row), so it is refused if that holder
// raised the token meanwhile.
const fenceCTE = `WITH cur AS MATERIALIZED (
  SELECT f.token, f.owner FROM outbox_fence f WHERE f.lock_name = $1::text FOR UPDATE),
raised AS (
  INSERT INTO outbox_fence AS f (lock_name, token, owner)
  SELECT $1::text, $2::bigint, $3::text WHERE NOT EXISTS (SELECT 1 FROM cur WHERE cur.token >= $2::bigint)
  ON CONFLICT (lock_name) DO UPDATE SET token = EXCLUDED.token, owner = EXCLUDED.owner
  WHERE f.token < EXCLUDED.token
     OR (f.token = EXCLUDED.token AND f.owner IS NOT DISTINCT FROM EXCLUDED.owner)
  RETURNING token),
fence AS (
  SELECT cur.token FROM cur WHERE cur.token = $2::bigint AND cur.owner IS NOT DISTINCT FROM $3::text
  UNION ALL SELECT token FROM raised)`

// fenced runs a statement built on fenceCTE whose final SELECT returns the
// fence's outcome first and then the write counts; ErrStaleFence when the
// fence refused.
func (s *Store) fenced(ctx context.Context, f Fence, sql string, counts []*int64, args ...any) error {
	dest := make([]any, len(counts))
	for i, c := range counts {
		dest[i] = c
	}
	return s.fencedScan(ctx, f, sql, dest, args...)
}

// fencedScan is fenced with the write's results scanned into dest, of any
// type (the fence's outcome still comes first).
func (s *Store) fencedScan(ctx context.Context, f Fence, sql string, dest []any, args ...any) error {
	if f.Token <= 0 {
		return fmt.Errorf("store: fenced write for %q without a token", f.Lock)
	}
	var ok bool
	dest = append([]any{&ok}, dest...)
	if err := s.db.QueryRow(ctx, sql, append([]any{f.Lock, f.Token, f.Owner}, args...)...).Scan(dest...); err != nil {
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
	err := s.db.QueryRow(ctx, `SELECT token FROM outbox_fence WHERE lock_name = $1`, lock).Scan(&t)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, wrap("read fence "+lock, err)
	}
	return t, nil
}

// FenceTokens returns every lock's accepted token.
func (s *Store) FenceTokens(ctx context.Context) (map[string]int64, error) {
	rows, err := s.db.Query(ctx, `SELECT lock_name, token FROM outbox_fence ORDER BY lock_name`)
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
	return s.fenced(ctx, f, fenceCTE+`,
sync AS (SELECT set_config('synchronous_commit', 'on', true))
SELECT EXISTS (SELECT 1 FROM fence) FROM sync`, nil)
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

// completeSQL commits asynchronously: synchronous_commit is off for its
// own transaction only (set_config local, in the statement, so it costs no
// round trip). See Complete for why that is safe.
//
// The failures' pending condition is written in the opaque COALESCE form
// (store/backoff.go): as a plain conjunction it matched
// outbox_pending_aggregate_idx's predicate, and the generic plan made on a
// small table would hash that whole index to join the batch's failures:
// every batch with a failure would walk every pending row and, under a
// snapshot held elsewhere, every row delivered since
// (TestHotPathPlansMadeOnASmallTableStayFlat).
//
// The delivered rows are found by one scan of the primary key for the
// batch's ids (= ANY), and each is checked against its (id, created_at)
// pair in a hash (NOT ... NOT IN: a hashed subplan, not a join the planner
// could make a loop of). Joined to the pairs (unnest), the plan would probe
// the primary key once per row, and each probe would read the row's heap
// page again where the scan keeps it pinned from row to row: one buffer
// more per row.
const completeSQL = fenceCTE + `,
async AS (SELECT set_config('synchronous_commit', 'off', true)),
delivered AS (
  UPDATE outbox o SET dispatched_at = now(), last_error = NULL
  WHERE o.id = ANY ($4::bigint[]) AND o.dispatched_at IS NULL
    AND NOT ((o.id, o.created_at) NOT IN (SELECT * FROM unnest($4::bigint[], $9::timestamptz[]))) -- hashed
    AND EXISTS (SELECT 1 FROM fence)
  RETURNING 1),
failed AS (
  UPDATE outbox o SET attempts = LEAST(GREATEST(o.attempts, 0), 2147483646) + 1, last_error = x.err,
    available_at = CASE WHEN x.dead THEN o.available_at ELSE now() + x.delay_us * interval '1 microsecond' END,
    dead_at = CASE WHEN x.dead THEN now() END
  FROM unnest($5::bigint[], $6::text[], $7::bigint[], $8::bool[], $10::timestamptz[]) AS x(id, err, delay_us, dead, created_at)
  WHERE o.id = x.id AND (x.created_at IS NULL OR o.created_at = x.created_at)
    AND COALESCE(o.dispatched_at IS NULL AND o.dead_at IS NULL, false) AND EXISTS (SELECT 1 FROM fence)
  RETURNING o.id, o.attempts, o.created_at),` + historyCTE + `
SELECT EXISTS (SELECT 1 FROM fence), (SELECT count(*) FROM delivered), (SELECT count(*) FROM failed) FROM async`

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
func (s *Store) Complete(ctx context.Context, f Fence, delivered []Delivered, failures []Failure) (nDelivered, nFailed int64, err error) {
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

func (s *Store) complete(ctx context.Context, f Fence, delivered []Delivered, failures []Failure) (nDelivered, nFailed int64, err error) {
	if len(delivered) == 0 && len(failures) == 0 {
		return 0, 0, nil
	}
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
	err = s.fenced(ctx, f, completeSQL, []*int64{&nDelivered, &nFailed}, int8Array(done), ids, errs, delay, dead, created, made, kinds, ms)
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
