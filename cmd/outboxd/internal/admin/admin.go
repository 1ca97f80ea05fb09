// Package admin is every operator control of outboxd as one set of
// methods: status, destinations, pause and resume, the dead-letter list and
// one dead row, replay, discard and resend. The admin API on the ops port
// (package httpapi), the console and `outboxd ... --via` call these; each
// write runs under lock:reconciliation exactly as its CLI command does, so
// a write whose term was taken over changes nothing more (ErrStale).
//
// The package imports neither app nor httpapi: the daemon hands it the
// functions that read the relay's own state (Deps).
package admin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/outboxd/outboxd/lock"
	"github.com/outboxd/outboxd/reconcile"
	"github.com/outboxd/outboxd/store"
)

// Sentinel errors callers tell apart (the admin API maps each to a status
// code: ErrInvalid 400, ErrNotFound 404, ErrStale 409, ErrBusy 423).
var (
	// ErrInvalid: the request is malformed (a filter, an unknown
	// destination, no filter without All).
	ErrInvalid = errors.New("admin: invalid request")
	// ErrNotFound: no such dead row.
	ErrNotFound = errors.New("admin: not found")
	// ErrStale: lock:reconciliation was taken over by a newer holder whose
	// fence refused the write (store.ErrStaleFence).
	ErrStale = errors.New("admin: stale fence")
	// ErrBusy: lock:reconciliation stayed held elsewhere past the wait.
	ErrBusy = errors.New("admin: lock:reconciliation held elsewhere")
)

// Caller is who asked: the name of the bearer token the request carried
// (http.auth_tokens), "default" for http.auth_token, "cli" for a command
// run with the database's credentials.
type Caller struct {
	Name string `json:"name"`
}

// Deps are what the operations act on.
type Deps struct {
	// Store reads (the ops pool on a daemon).
	Store store.Ops
	// Reconciler writes under lock:reconciliation.
	Reconciler *reconcile.Reconciler
	// Status is the /status body (app.Status).
	Status func(ctx context.Context) (any, error)
	// Destinations are the configured destinations as the relay sees them.
	Destinations func(ctx context.Context) ([]Destination, error)
	// AwaitPause waits until the leader took pause generation gen into
	// effect (app.AwaitPause); nil: pause and resume do not wait.
	AwaitPause func(ctx context.Context, gen int64, wait time.Duration) (PauseEffect, error)
	// Routes choose each event's destination, as the configuration routes
	// it; a resend to one destination needs them.
	Routes Routes
	// Log gets one line per write: who asked and what it changed.
	Log *slog.Logger
}

// Routes name each event's destination (dispatch.Routes): every
// configured destination, and the one an event of an aggregate type and
// an event type goes to ("" when none).
type Routes interface {
	Names() []string
	Route(aggregateType, eventType string) string
}

// Service is the operator controls.
type Service struct {
	d Deps
}

// New returns the controls over d.
func New(d Deps) *Service {
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	return &Service{d: d}
}

// Destination is one destination: its circuit, pause, backlog and lag.
type Destination struct {
	Name         string    `json:"name"`
	Sink         string    `json:"sink"`
	Circuit      string    `json:"circuit"` // "open" or "closed"
	CircuitSince time.Time `json:"circuit_open_since,omitzero"`
	CircuitError string    `json:"circuit_last_error,omitempty"`
	Paused       bool      `json:"paused"`
	PausedAt     time.Time `json:"paused_at,omitzero"`
	// Backlog is how many rows are pending (all destinations share the
	// outbox table); LagSeconds the age of the oldest pending one.
	Backlog    int64   `json:"backlog"`
	LagSeconds float64 `json:"lag_seconds"`
}

// PauseEffect says how a pause or resume took effect.
type PauseEffect struct {
	Leader   string `json:"leader,omitempty"`
	NoLeader bool   `json:"no_leader,omitempty"`
}

// PauseRequest names the destinations to pause or resume.
type PauseRequest struct {
	Destinations []string      `json:"destinations,omitempty"`
	All          bool          `json:"all,omitempty"`
	LockWait     time.Duration `json:"lock_wait,omitempty"` // default reconcile.DefaultReplayLockWait
	Wait         time.Duration `json:"wait,omitempty"`      // for the leader; 0: do not wait
}

// PauseResult is what a pause or resume changed.
type PauseResult struct {
	Changed    []string    `json:"changed"`
	Generation int64       `json:"generation"`
	Effect     PauseEffect `json:"effect"`
	Awaited    bool        `json:"awaited"`
}

// DeadListRequest is a page of the dead-letter list.
type DeadListRequest struct {
	Filter store.DeadFilter
	After  *store.DeadCursor
	Limit  int
}

// DeadShown is one dead row with its attempt history.
type DeadShown struct {
	store.DeadEvent
	History []store.Attempt `json:"history"`
}

// DeadWriteRequest selects dead rows for replay or discard.
type DeadWriteRequest struct {
	Filter   store.DeadFilter `json:"-"`
	All      bool             `json:"all,omitempty"` // discard: required when Filter selects every row
	DryRun   bool             `json:"dry_run,omitempty"`
	LockWait time.Duration    `json:"lock_wait,omitempty"`
}

// DeadWriteResult is how many rows a replay requeued or a discard
// deleted (a dry run: would).
type DeadWriteResult struct {
	Count     int64             `json:"count"`
	DryRun    bool              `json:"dry_run"`
	Discarded []store.Discarded `json:"discarded,omitempty"`
}

// ResendRequest selects delivered rows to send again.
type ResendRequest struct {
	Filter   store.ResendFilter `json:"-"`
	All      bool               `json:"all,omitempty"` // required when Filter selects every delivered row
	DryRun   bool               `json:"dry_run,omitempty"`
	Limit    int                `json:"limit,omitempty"` // at most this many rows; 0: no bound
	LockWait time.Duration      `json:"lock_wait,omitempty"`
	// Destination: only the rows the routes send to this destination now
	// (before Limit); "" for every destination.
	Destination string `json:"destination,omitempty"`
}

// ResendResult is what a resend did: how many delivered rows it copied
// as new pending rows (a dry run: would), and the ids asked for that no
// longer exist (purged past reconcile.retention, or never delivered).
type ResendResult struct {
	Count  int64   `json:"count"`
	DryRun bool    `json:"dry_run"`
	Gone   []int64 `json:"gone"`
	// GoneBefore: delivered rows older than this are past retention and
	// were purged; a --since before it asks for some of them.
	GoneBefore time.Time `json:"gone_before,omitzero"`
	// Copies maps each resent row's id to its copy's id, oldest first.
	Copies []store.ResentCopy `json:"copies,omitempty"`
}

// Status is the relay's status (the /status body).
func (s *Service) Status(ctx context.Context) (any, error) {
	return s.d.Status(ctx)
}

// Destinations lists the destinations with circuit, pause, backlog, lag.
func (s *Service) Destinations(ctx context.Context) ([]Destination, error) {
	return s.d.Destinations(ctx)
}

// Pause pauses the destinations (or all).
func (s *Service) Pause(ctx context.Context, who Caller, req PauseRequest) (PauseResult, error) {
	return s.switchDest(ctx, who, req, true)
}

// Resume resumes the destinations (or every paused one with All).
func (s *Service) Resume(ctx context.Context, who Caller, req PauseRequest) (PauseResult, error) {
	return s.switchDest(ctx, who, req, false)
}

// DeadList is one page of the dead-letter list.
func (s *Service) DeadList(ctx context.Context, req DeadListRequest) (store.DeadPage, error) {
	return s.d.Store.ListDead(ctx, store.DeadQuery{Filter: req.Filter, After: req.After, Limit: req.Limit})
}

// DeadShow is one dead row with its attempt history; ErrNotFound when no
// dead row has that id.
func (s *Service) DeadShow(ctx context.Context, id int64) (DeadShown, error) {
	e, err := s.d.Store.ShowDead(ctx, id)
	if errors.Is(err, store.ErrNoRow) || errors.Is(err, store.ErrNotDead) {
		return DeadShown{}, fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	if err != nil {
		return DeadShown{}, err
	}
	hist, err := s.d.Store.History(ctx, e.ID, e.CreatedAt)
	if err != nil {
		return DeadShown{}, err
	}
	return DeadShown{e, hist}, nil
}

// Replay requeues the dead rows req selects.
func (s *Service) Replay(ctx context.Context, who Caller, req DeadWriteRequest) (DeadWriteResult, error) {
	if req.DryRun {
		n, err := s.d.Store.CountDead(ctx, req.Filter)
		return DeadWriteResult{Count: n, DryRun: true}, err
	}
	n, err := s.d.Reconciler.Replay(ctx, req.Filter, lockWait(req.LockWait), nil)
	s.logWrite(who, "replay", err, "requeued", n)
	return DeadWriteResult{Count: n}, classify(err)
}

// Discard deletes the dead rows req selects; every dead row only with All.
func (s *Service) Discard(ctx context.Context, who Caller, req DeadWriteRequest) (DeadWriteResult, error) {
	if !req.All && IsZeroDeadFilter(req.Filter) {
		return DeadWriteResult{}, fmt.Errorf("%w: all: without an id or a filter, discard deletes every dead-lettered event; say all to mean it", ErrInvalid)
	}
	if req.DryRun {
		n, err := s.d.Store.CountDead(ctx, req.Filter)
		return DeadWriteResult{Count: n, DryRun: true}, err
	}
	var out DeadWriteResult
	n, err := s.d.Reconciler.Discard(ctx, req.Filter, lockWait(req.LockWait), func(rows []store.Discarded) {
		out.Discarded = append(out.Discarded, rows...)
	})
	out.Count = n
	s.logWrite(who, "discard", err, "discarded", n)
	return out, classify(err)
}

// Resend copies the delivered rows req selects as new pending rows, each
// marked as a redelivery of its original (store.Resend). The ids asked for
// that have no row any more, and a since bound older than the retention,
// are reported (Gone, GoneBefore), never skipped silently.
func (s *Service) Resend(ctx context.Context, who Caller, req ResendRequest) (ResendResult, error) {
	if !req.All && req.Filter.IsZero() {
		return ResendResult{}, fmt.Errorf("%w: all: without an id or a filter, resend sends every delivered event again; say all to mean it", ErrInvalid)
	}
	out := ResendResult{DryRun: req.DryRun, Copies: []store.ResentCopy{}}
	var err error
	if out.Gone, err = s.d.Store.MissingRows(ctx, req.Filter.IDs); err != nil {
		return out, err
	}
	out.GoneBefore = s.goneBefore(req.Filter)
	if req.Destination != "" {
		kinds, err := s.destinationKinds(ctx, req.Filter, req.Destination)
		if err != nil || len(kinds) == 0 {
			return out, err // none of the selected rows goes there: nothing to resend
		}
		req.Filter.Kinds = kinds
	}
	if req.DryRun {
		out.Count, err = s.d.Store.CountResend(ctx, req.Filter, req.Limit)
		return out, err
	}
	out.Copies, err = s.d.Reconciler.Resend(ctx, req.Filter, req.Limit, lockWait(req.LockWait))
	out.Count = int64(len(out.Copies))
	s.logWrite(who, "resend", err, "resent", out.Count, "gone", len(out.Gone), "destination", req.Destination)
	return out, classify(err)
}

// destinationKinds are the (aggregate_type, event_type) pairs of f's
// delivered rows that the routes send to dest; an unknown destination is
// ErrInvalid.
func (s *Service) destinationKinds(ctx context.Context, f store.ResendFilter, dest string) ([]store.EventKind, error) {
	if s.d.Routes == nil {
		return nil, fmt.Errorf("%w: destination: the routes are not known here", ErrInvalid)
	}
	if names := s.d.Routes.Names(); !slices.Contains(names, dest) {
		return nil, fmt.Errorf("%w: destination: unknown destination %q (have %s)", ErrInvalid, dest, strings.Join(names, ", "))
	}
	kinds, err := s.d.Store.ResendKinds(ctx, f)
	if err != nil {
		return nil, err
	}
	return KindsRoutedTo(s.d.Routes, kinds, dest), nil
}

// KindsRoutedTo are the kinds that routes send to dest, in their order.
func KindsRoutedTo(routes Routes, kinds []store.EventKind, dest string) []store.EventKind {
	out := []store.EventKind{}
	for _, k := range kinds {
		if routes.Route(k.AggregateType, k.EventType) == dest {
			out = append(out, k)
		}
	}
	return out
}

// goneBefore is the retention horizon when f's lower time bound lies
// before it (rows older than the horizon were purged), else zero.
func (s *Service) goneBefore(f store.ResendFilter) time.Time {
	horizon := time.Now().Add(-s.d.Reconciler.Retention())
	since := f.Since
	if f.SinceAgo > 0 {
		since = time.Now().Add(-f.SinceAgo)
	}
	if since.IsZero() || !since.Before(horizon) {
		return time.Time{}
	}
	return horizon.UTC().Truncate(time.Second)
}

// IsZeroDeadFilter: f selects every dead row.
func IsZeroDeadFilter(f store.DeadFilter) bool {
	return len(f.IDs) == 0 && f.AggregateType == "" && f.AggregateID == "" && f.EventType == "" &&
		f.Since.IsZero() && f.Until.IsZero() && f.SinceAgo == 0 && f.UntilAgo == 0 && f.Error == ""
}

// switchDest pauses or resumes.
func (s *Service) switchDest(ctx context.Context, who Caller, req PauseRequest, pause bool) (PauseResult, error) {
	verb := map[bool]string{true: "pause", false: "resume"}[pause]
	if req.All == (len(req.Destinations) > 0) {
		return PauseResult{}, fmt.Errorf("%w: %s takes destinations or all", ErrInvalid, verb)
	}
	names, err := s.switchNames(ctx, req, pause)
	if err != nil {
		return PauseResult{}, err
	}
	var sw store.Switched
	if pause {
		sw, err = s.d.Reconciler.Pause(ctx, names, lockWait(req.LockWait))
	} else {
		sw, err = s.d.Reconciler.Resume(ctx, names, req.All, lockWait(req.LockWait))
	}
	s.logWrite(who, verb, err, "destinations", strings.Join(names, ","), "changed", strings.Join(sw.Names, ","), "generation", sw.Generation)
	if err != nil {
		return PauseResult{}, classify(err)
	}
	out := PauseResult{Changed: sw.Names, Generation: sw.Generation}
	if out.Changed == nil {
		out.Changed = []string{}
	}
	if req.Wait > 0 && s.d.AwaitPause != nil {
		eff, err := s.d.AwaitPause(ctx, sw.Generation, req.Wait)
		if err != nil {
			return out, err
		}
		out.Effect, out.Awaited = eff, true
	}
	return out, nil
}

// switchNames is the destinations a pause or resume names: req's, each
// known; for a pause of all, every destination known now (a resume of all
// resumes whatever is paused).
func (s *Service) switchNames(ctx context.Context, req PauseRequest, pause bool) ([]string, error) {
	if req.All && !pause {
		return req.Destinations, nil
	}
	known, err := s.d.Destinations(ctx)
	if err != nil {
		return nil, err
	}
	if req.All {
		names := make([]string, 0, len(known))
		for _, d := range known {
			names = append(names, d.Name)
		}
		return names, nil
	}
	for _, n := range req.Destinations {
		if !slices.ContainsFunc(known, func(d Destination) bool { return d.Name == n }) {
			return nil, fmt.Errorf("%w: unknown destination %q", ErrInvalid, n)
		}
	}
	return req.Destinations, nil
}

// logWrite logs one write: "admin write" with who asked, the operation,
// what it changed, and its error if any.
func (s *Service) logWrite(who Caller, op string, err error, changed ...any) {
	args := append([]any{"caller", who.Name, "op", op}, changed...)
	if err != nil {
		s.d.Log.Warn("admin write refused", append(args, "error", err.Error())...)
		return
	}
	s.d.Log.Info("admin write", args...)
}

// classify wraps err with the sentinel a caller tells apart.
func classify(err error) error {
	var held *lock.HolderError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, store.ErrStaleFence):
		return fmt.Errorf("%w: lock:reconciliation was taken over by a newer holder, whose fence refused the write: %w", ErrStale, err)
	case errors.As(err, &held), errors.Is(err, lock.ErrNotObtained):
		return fmt.Errorf("%w: %w", ErrBusy, err)
	}
	return err
}

// lockWait is d, or the CLI's default.
func lockWait(d time.Duration) time.Duration {
	if d <= 0 {
		return reconcile.DefaultReplayLockWait
	}
	return d
}
