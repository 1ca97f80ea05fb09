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

// The statements of paused.sql.
var (
	pauseQ      = stmt("pause")
	resumeQ     = stmt("resume")
	pausedListQ = stmt("paused_list")
)

// PauseDestinations pauses names, fenced (the writer holds
// lock:reconciliation); it returns how many were not paused before.
func (s *Store) PauseDestinations(ctx context.Context, f Fence, names []string) (int64, error) {
	var n int64
	if err := s.fenced(ctx, f, pauseQ, []*int64{&n}, pgx.NamedArgs{"names": names}); err != nil {
		return 0, wrap("pause", err)
	}
	return n, nil
}

// ResumeDestinations resumes names, or every paused destination when all,
// fenced; it returns how many were paused.
func (s *Store) ResumeDestinations(ctx context.Context, f Fence, names []string, all bool) (int64, error) {
	var n int64
	if err := s.fenced(ctx, f, resumeQ, []*int64{&n}, pgx.NamedArgs{"names": names, "all": all}); err != nil {
		return 0, wrap("resume", err)
	}
	return n, nil
}

// PausedDestinations lists the paused destinations by name.
func (s *Store) PausedDestinations(ctx context.Context) ([]PausedDestination, error) {
	rows, err := pausedListQ.query(ctx, s.db, nil)
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
