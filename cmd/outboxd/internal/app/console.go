package app

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/console"
	"github.com/outboxd/outboxd/cmd/outboxd/internal/httpapi"
	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/internal/keys"
	"github.com/outboxd/outboxd/poller"
	"github.com/outboxd/outboxd/store"
)

// consoleWait is how long a console write waits for lock:reconciliation,
// and then for the leader to take a pause into effect.
const consoleWait = 10 * time.Second

// consoleBackend is what the console at /ui reads and changes: the
// operations pool ops for reads, and a reconciler of its own on ops for
// each write, fenced under lock:reconciliation as the CLI's commands are.
type consoleBackend struct {
	a     *App
	ops   *store.Store
	p     *poller.Poller
	built map[string]dispatch.Sink
}

// consoleHandler is the console for the running relay: its reads and
// writes on ops within bound, its chart from ring.
func (a *App) consoleHandler(p *poller.Poller, sink dispatch.Sink, ops *store.Store, ring *console.Ring, offLoopback bool,
	bound func(http.HandlerFunc, httpapi.Busy) http.HandlerFunc) http.Handler {
	return console.Handler(console.Deps{
		Backend: &consoleBackend{a: a, ops: ops, p: p, built: sinksOf(sink)}, Samples: ring,
		Bound: func(h http.HandlerFunc, busy func(http.ResponseWriter, *http.Request, time.Duration)) http.HandlerFunc {
			return bound(h, busy)
		},
		AuthToken: a.Cfg.HTTP.AuthToken, OffLoopback: offLoopback, Log: a.Log,
	})
}

// backlog is the backlog gauges' count, refreshed as a scrape refreshes
// it (spaced out while counts are slow: backlogGate).
func (b *consoleBackend) backlog(ctx context.Context) (store.Stats, error) {
	b.a.refreshBacklog(ctx, b.ops)
	st, at := b.a.backlog.latest()
	if at.IsZero() {
		return store.Stats{}, errors.New("the backlog could not be counted yet (see /readyz)")
	}
	return st, nil
}

// Overview is /status's view, the leader first.
func (b *consoleBackend) Overview(ctx context.Context) (console.Overview, error) {
	st, err := b.a.status(ctx, b.ops, map[string]func() int64{keys.PollerLock: b.p.HeldToken}, b.built, b.backlog)
	if err != nil {
		return console.Overview{}, err
	}
	_, at := b.a.backlog.latest()
	ov := console.Overview{Replicas: st.Replicas, Backlog: st.Stats, BacklogAt: at, FetchError: st.FetchError}
	if ferr := b.p.FetchFailure(time.Now()); ferr != nil {
		ov.FetchError = ferr.Error()
	}
	for _, l := range st.Locks {
		if l.Name == keys.PollerLock {
			ov.Leader = console.Leader{Instance: l.Holder, FenceToken: l.FenceToken, RedisCounter: l.RedisCounter,
				TTL: (time.Duration(l.TTLMillis) * time.Millisecond).Round(100 * time.Millisecond), Error: l.Error}
			if l.Owner != "" && l.Holder == "" {
				ov.Leader.Instance = "(an unnamed holder)"
			}
		}
	}
	for _, d := range st.Destinations {
		ov.Destinations = append(ov.Destinations, console.Destination{Name: d.Name, Sink: d.Sink, Circuit: d.Circuit,
			CircuitSince: d.CircuitSince, CircuitError: d.CircuitError, Paused: d.Paused, PausedAt: d.PausedAt})
	}
	return ov, nil
}

func (b *consoleBackend) ListDead(ctx context.Context, f store.DeadFilter, after *store.DeadCursor, limit int) (store.DeadPage, error) {
	return b.ops.ListDead(ctx, f, after, limit)
}

func (b *consoleBackend) ShowDead(ctx context.Context, id int64) (store.DeadEvent, error) {
	return b.ops.ShowDead(ctx, id)
}

func (b *consoleBackend) History(ctx context.Context, id int64, createdAt pgtype.Timestamptz) ([]store.Attempt, error) {
	return b.ops.History(ctx, id, createdAt)
}

// SetPaused is `outboxd pause NAME` (or resume): a fenced write, then a
// wait for the leader to take it into effect.
func (b *consoleBackend) SetPaused(ctx context.Context, name string, pause bool) (string, error) {
	if !slices.ContainsFunc(destinations(b.a.Cfg), func(d destination) bool { return d.name == name }) {
		return "", fmt.Errorf("%w %q", console.ErrUnknownDestination, name)
	}
	rec, err := b.a.reconcilerOn(b.ops)
	if err != nil {
		return "", err
	}
	var sw store.Switched
	if pause {
		sw, err = rec.Pause(ctx, []string{name}, consoleWait)
	} else {
		sw, err = rec.Resume(ctx, []string{name}, false, consoleWait)
	}
	if err != nil {
		return "", fmt.Errorf("nothing changed: %w", err)
	}
	eff, err := b.a.AwaitPause(ctx, sw.Generation, consoleWait)
	switch {
	case err != nil:
		return "", fmt.Errorf("written, not yet in effect: %w", err)
	case eff.NoLeader:
		return "written; no replica leads: the next leader reads it before its first send", nil
	}
	return "acknowledged by the leader " + eff.Leader, nil
}

// Count is what a dry run of op prints.
func (b *consoleBackend) Count(ctx context.Context, op console.Op, f console.Filter) (int64, error) {
	return b.ops.CountDead(ctx, f)
}

// Apply is `outboxd replay --dead` or `outboxd dead discard` with f.
func (b *consoleBackend) Apply(ctx context.Context, op console.Op, f console.Filter) (int64, error) {
	rec, err := b.a.reconcilerOn(b.ops)
	if err != nil {
		return 0, err
	}
	switch op {
	case console.OpReplay:
		return rec.Replay(ctx, f, consoleWait, nil)
	case console.OpDiscard:
		return rec.Discard(ctx, f, consoleWait, nil)
	}
	return 0, fmt.Errorf("console: unknown operation %q", op)
}
