package app

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/admin"
	"github.com/outboxd/outboxd/cmd/outboxd/internal/console"
	"github.com/outboxd/outboxd/cmd/outboxd/internal/httpapi"
	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/internal/keys"
	"github.com/outboxd/outboxd/poller"
	"github.com/outboxd/outboxd/store"
)

// consoleBackend is what the console at /ui reads and changes: the
// operator controls (admin.Service on the operations pool, a reconciler
// of its own for the writes) and the overview, read as /status is.
type consoleBackend struct {
	*admin.Service
	a     *App
	ops   *store.Store
	p     *poller.Poller
	built map[string]dispatch.Sink
}

// consoleUI builds the console for the running relay (httpapi.Deps.UI):
// its writes through svc (the admin API's controls), its overview on ops,
// the pages that read within the operations limit, its chart from ring.
func (a *App) consoleUI(svc *admin.Service, p *poller.Poller, sink dispatch.Sink, ops *store.Store, ring *console.Ring, tokens []console.Token, offLoopback bool,
) func(bound func(http.HandlerFunc, httpapi.Busy) http.HandlerFunc) http.Handler {
	if svc == nil {
		return nil
	}
	b := &consoleBackend{Service: svc, a: a, ops: ops, p: p, built: sinksOf(sink)}
	return func(bound func(http.HandlerFunc, httpapi.Busy) http.HandlerFunc) http.Handler {
		return console.Handler(console.Deps{
			Backend: b, Samples: ring, Tokens: tokens, OffLoopback: offLoopback, Log: a.Log,
			Bound: func(h http.HandlerFunc, busy func(http.ResponseWriter, *http.Request, time.Duration)) http.HandlerFunc {
				return bound(h, busy)
			},
		})
	}
}

// consoleTokens are the tokens the console signs a browser in with: the
// admin API's, http.auth_token named "default".
func consoleTokens(d httpapi.Deps) []console.Token {
	out := []console.Token{{Name: "default", Value: d.AuthToken}}
	for _, t := range d.Tokens {
		out = append(out, console.Token{Name: t.Name, Value: t.Value})
	}
	return out
}

// backlog is the backlog gauges' count, refreshed as a scrape refreshes
// it (spaced out while counts are slow: backlogGate).
func (b *consoleBackend) backlog(ctx context.Context) (store.Stats, error) {
	b.a.refreshBacklog(ctx, b.ops.Ops())
	st, at := b.a.backlog.latest()
	if at.IsZero() {
		return store.Stats{}, errors.New("the backlog could not be counted yet (see /readyz)")
	}
	return st, nil
}

// Overview is /status's view, the leader first.
func (b *consoleBackend) Overview(ctx context.Context) (console.Overview, error) {
	st, err := b.a.status(ctx, b.ops.Ops(), map[string]func() int64{keys.PollerLock: b.p.HeldToken}, b.built, b.backlog)
	if err != nil {
		return console.Overview{}, err
	}
	_, at := b.a.backlog.latest()
	ov := console.Overview{Replicas: st.Replicas, Backlog: st.Stats, BacklogAt: at}
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
