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

// The statements of paused.sql.
var (
	pauseQ        = stmt("pause")
	resumeQ       = stmt("resume")
	pausedListQ   = stmt("paused_list")
	pauseSetQ     = stmt("pause_set")
	ackPauseQ     = stmt("ack_pause")
	pauseAppliedQ = stmt("pause_applied")
)

// PauseDestinations pauses names, fenced (the writer holds
// lock:reconciliation); it returns those not paused before and the new
// pause generation.
func (s Reconcile) PauseDestinations(ctx context.Context, f Fence, names []string) (Switched, error) {
	var out Switched
	if err := s.fencedScan(ctx, f, pauseQ, []any{&out.Names, &out.Generation}, pgx.NamedArgs{"names": names}); err != nil {
		return Switched{}, wrap("pause", err)
	}
	return out, nil
}

// Resume names the destinations ResumeDestinations resumes: Names, or
// every paused destination (configured or not) when All.
type Resume struct {
	Names []string
	All   bool
}

// ResumeDestinations resumes r's destinations, fenced; it returns those it
// resumed and the new pause generation.
func (s Reconcile) ResumeDestinations(ctx context.Context, f Fence, r Resume) (Switched, error) {
	names, all := r.Names, r.All
	var out Switched
	if err := s.fencedScan(ctx, f, resumeQ, []any{&out.Names, &out.Generation}, pgx.NamedArgs{"names": names, "all": all}); err != nil {
		return Switched{}, wrap("resume", err)
	}
	return out, nil
}

// PausedDestinations lists the paused destinations by name.
func (s Ops) PausedDestinations(ctx context.Context) ([]PausedDestination, error) {
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

// PauseSet is the paused destinations and the pause generation they are
// at, read together (one statement, one snapshot).
type PauseSet struct {
	Names      []string
	Generation int64
}

// ReadPauseSet reads the paused destinations with their generation.
func (s ReadPath) ReadPauseSet(ctx context.Context) (PauseSet, error) {
	var ps PauseSet
	err := pauseSetQ.queryRow(ctx, s.db, nil).Scan(&ps.Names, &ps.Generation)
	if err != nil {
		return PauseSet{}, wrap("paused destinations", err)
	}
	return ps, nil
}

// AckPause records, fenced under the leader's term, that it holds back
// the sends of the destinations paused at generation gen (ReadPauseSet)
// and no longer those resumed by then.
func (s ReadPath) AckPause(ctx context.Context, f Fence, gen int64) error {
	var n int64
	if err := s.fenced(ctx, f, ackPauseQ, []*int64{&n}, pgx.NamedArgs{"generation": gen}); err != nil {
		return wrap("acknowledge pause", err)
	}
	return nil
}

// PauseApplied is the highest pause generation a leader has acknowledged
// (AckPause), 0 when none.
func (s Ops) PauseApplied(ctx context.Context) (int64, error) {
	var n int64
	err := pauseAppliedQ.queryRow(ctx, s.db, nil).Scan(&n)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, wrap("pause generation", err)
	}
	return n, nil
}
