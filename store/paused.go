package store

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// PausedDestination is a destination an operator paused.
type PausedDestination struct {
	Destination string    `json:"destination"`
	PausedAt    time.Time `json:"paused_at"`
}

// Switched is what one pause or resume changed: the destinations it
// paused (or resumed), by name, and the pause generation it wrote, which
// the leader acknowledges once it has taken the change into effect
// (AckPause, PauseApplied).
type Switched struct {
	Names      []string
	Generation int64
}

// generationCTE raises the pause generation (outbox_pause_generation) in
// a fenced statement: every pause and resume writes a new one.
const generationCTE = `,
gen AS (
  INSERT INTO outbox_pause_generation AS g (one, generation)
  SELECT true, 1 WHERE EXISTS (SELECT 1 FROM fence)
  ON CONFLICT (one) DO UPDATE SET generation = g.generation + 1
  RETURNING generation)`

// pauseSQL pauses the destinations $4 (already paused ones keep their
// paused_at) and raises the pause generation, as one fenced statement
// (fenceCTE: $1..$3).
const pauseSQL = fenceCTE + `,
added AS (
  INSERT INTO outbox_paused_destinations (destination, token)
  SELECT d, $2::bigint FROM unnest($4::text[]) d WHERE EXISTS (SELECT 1 FROM fence)
  ON CONFLICT (destination) DO NOTHING
  RETURNING destination)` + generationCTE + `
SELECT EXISTS (SELECT 1 FROM fence),
  COALESCE((SELECT array_agg(destination ORDER BY destination) FROM added), '{}'),
  COALESCE((SELECT generation FROM gen), 0)`

// unpauseSQL resumes the destinations $4, or every one when $5, and
// raises the pause generation, as one fenced statement.
const unpauseSQL = fenceCTE + `,
removed AS (
  DELETE FROM outbox_paused_destinations
  WHERE ($5::bool OR destination = ANY($4::text[])) AND EXISTS (SELECT 1 FROM fence)
  RETURNING destination)` + generationCTE + `
SELECT EXISTS (SELECT 1 FROM fence),
  COALESCE((SELECT array_agg(destination ORDER BY destination) FROM removed), '{}'),
  COALESCE((SELECT generation FROM gen), 0)`

// PauseDestinations pauses names, fenced (the writer holds
// lock:reconciliation); it returns those not paused before and the new
// pause generation.
func (s *Store) PauseDestinations(ctx context.Context, f Fence, names []string) (Switched, error) {
	var out Switched
	if err := s.fencedScan(ctx, f, pauseSQL, []any{&out.Names, &out.Generation}, names); err != nil {
		return Switched{}, wrap("pause", err)
	}
	return out, nil
}

// ResumeDestinations resumes names, or every paused destination when all
// (configured or not), fenced; it returns those it resumed and the new
// pause generation.
func (s *Store) ResumeDestinations(ctx context.Context, f Fence, names []string, all bool) (Switched, error) {
	var out Switched
	if err := s.fencedScan(ctx, f, unpauseSQL, []any{&out.Names, &out.Generation}, names, all); err != nil {
		return Switched{}, wrap("resume", err)
	}
	return out, nil
}

// PausedDestinations lists the paused destinations by name.
func (s *Store) PausedDestinations(ctx context.Context) ([]PausedDestination, error) {
	rows, err := s.db.Query(ctx, `SELECT destination, paused_at FROM outbox_paused_destinations ORDER BY destination`)
	if err != nil {
		return nil, wrap("paused destinations", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[PausedDestination])
	if err != nil {
		return nil, wrap("paused destinations", err)
	}
	for i := range out {
		out[i].PausedAt = out[i].PausedAt.UTC()
	}
	return out, nil
}

// PauseSet is the paused destinations and the pause generation they are
// at, read together (one statement, one snapshot).
type PauseSet struct {
	Names      []string
	Generation int64
}

// ReadPauseSet reads the paused destinations with their generation.
func (s *Store) ReadPauseSet(ctx context.Context) (PauseSet, error) {
	var ps PauseSet
	err := s.pool.QueryRow(ctx, `SELECT
  COALESCE((SELECT array_agg(destination ORDER BY destination) FROM outbox_paused_destinations), '{}'),
  COALESCE((SELECT generation FROM outbox_pause_generation), 0)`).Scan(&ps.Names, &ps.Generation)
	if err != nil {
		return PauseSet{}, wrap("paused destinations", err)
	}
	return ps, nil
}

// ackPauseSQL records that the leader (fenceCTE: $1..$3, its term of
// lock:outbox:poller) has taken generation $4 into effect; applied never
// goes back.
const ackPauseSQL = fenceCTE + `,
acked AS (
  UPDATE outbox_pause_generation SET applied = $4::bigint, applied_token = $2::bigint, applied_at = now()
  WHERE applied < $4::bigint AND EXISTS (SELECT 1 FROM fence)
  RETURNING 1)
SELECT EXISTS (SELECT 1 FROM fence), (SELECT count(*) FROM acked)`

// AckPause records, fenced under the leader's term, that it holds back
// the sends of the destinations paused at generation gen (ReadPauseSet)
// and no longer those resumed by then.
func (s *Store) AckPause(ctx context.Context, f Fence, gen int64) error {
	var n int64
	if err := s.fenced(ctx, f, ackPauseSQL, []*int64{&n}, gen); err != nil {
		return wrap("acknowledge pause", err)
	}
	return nil
}

// PauseApplied is the highest pause generation a leader has acknowledged
// (AckPause), 0 when none.
func (s *Store) PauseApplied(ctx context.Context) (int64, error) {
	var n int64
	err := s.pool.QueryRow(ctx, `SELECT applied FROM outbox_pause_generation`).Scan(&n)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, wrap("pause generation", err)
	}
	return n, nil
}
