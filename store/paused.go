package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// PausedDestination is a destination an operator paused.
type PausedDestination struct {
	Destination string    `json:"destination"`
	PausedAt    time.Time `json:"paused_at"`
}

// pauseSQL pauses the destinations $4 (already paused ones keep their
// paused_at), as one fenced statement (fenceCTE: $1..$3).
const pauseSQL = fenceCTE + `,
added AS (
  INSERT INTO outbox_paused_destinations (destination, token)
  SELECT d, $2::bigint FROM unnest($4::text[]) d WHERE EXISTS (SELECT 1 FROM fence)
  ON CONFLICT (destination) DO NOTHING
  RETURNING 1)
SELECT EXISTS (SELECT 1 FROM fence), (SELECT count(*) FROM added)`

// unpauseSQL resumes the destinations $4, or every one when $5, as one
// fenced statement.
const unpauseSQL = fenceCTE + `,
removed AS (
  DELETE FROM outbox_paused_destinations
  WHERE ($5::bool OR destination = ANY($4::text[])) AND EXISTS (SELECT 1 FROM fence)
  RETURNING 1)
SELECT EXISTS (SELECT 1 FROM fence), (SELECT count(*) FROM removed)`

// PauseDestinations pauses names, fenced (the writer holds
// lock:reconciliation); it returns how many were not paused before.
func (s *Store) PauseDestinations(ctx context.Context, f Fence, names []string) (int64, error) {
	var n int64
	if err := s.fenced(ctx, f, pauseSQL, []*int64{&n}, names); err != nil {
		return 0, wrap("pause", err)
	}
	return n, nil
}

// ResumeDestinations resumes names, or every paused destination when all,
// fenced; it returns how many were paused.
func (s *Store) ResumeDestinations(ctx context.Context, f Fence, names []string, all bool) (int64, error) {
	var n int64
	if err := s.fenced(ctx, f, unpauseSQL, []*int64{&n}, names, all); err != nil {
		return 0, wrap("resume", err)
	}
	return n, nil
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
