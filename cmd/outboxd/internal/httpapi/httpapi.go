// Package httpapi serves outboxd's operations endpoints: /livez, /readyz,
// /metrics, /status and /dead, the admin API under /admin/, the console
// under /ui, and /debug/pprof/ when asked for.
package httpapi

import (
	"cmp"
	"context"
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/admin"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Check reports whether a dependency is reachable.
type Check func(ctx context.Context) error

// Deps are what the endpoints read.
type Deps struct {
	Checks   map[string]Check // /readyz: all must pass
	Registry *prometheus.Registry
	Status   func(ctx context.Context) (any, error) // /status body
	// BeforeScrape, if set, refreshes gauges that are read from elsewhere
	// (the backlog in Postgres) so a scrape never shows a stale value.
	BeforeScrape func(ctx context.Context)
	// Dead serves /dead, the dead-letter list, and /dead/{id}, one dead row
	// with its attempt history (read-only); nil: neither.
	Dead DeadLister
	// Pprof serves net/http/pprof under /debug/pprof/ (http.pprof): CPU and
	// heap profiles of the running daemon, for benchmarks and incidents.
	// Off by default: a profile can be expensive and shows internals.
	Pprof bool
	// AuthToken (http.auth_token), when set, is required as a bearer token
	// by /metrics, /status, /dead and /debug/pprof/; /livez and /readyz
	// stay open for probes.
	AuthToken string
	// Tokens are more named bearer tokens (http.auth_tokens_file), accepted
	// as AuthToken is; AuthToken itself is named "default".
	Tokens []Token
	// Admin serves the admin API under /admin/ (reads as /status and /dead
	// are guarded, writes always behind a token); nil: none.
	Admin *admin.Service
	// OffLoopback: http.addr is reachable from other hosts (not Loopback).
	// Without AuthToken, /dead, /dead/{id} and /debug/pprof/ then answer
	// 403 (refusePayloads); the other paths serve as usual.
	OffLoopback bool
	// MaxConcurrent (http.max_concurrent) bounds the requests that read
	// Postgres at once: /dead, /dead/{id} and /status beyond it answer 503
	// with Retry-After, and a scrape beyond it shows the backlog gauges'
	// last values (limit). 0: no bound.
	MaxConcurrent int
	// UI builds the console served under /ui (its own sign-in and CSRF
	// checks, not the bearer token a browser cannot send); it wraps each
	// of its pages that read Postgres in bound, the limit /status is
	// served within, answering a refused request with busy. nil: no console.
	UI func(bound func(h http.HandlerFunc, busy Busy) http.HandlerFunc) http.Handler
	// OpsShare is the share of each of those places' time the requests
	// may read for (0 < OpsShare < 1; otherwise no rest): after a request
	// of d the place rests d×(1/OpsShare − 1), so a crowd of readers costs
	// delivery at most that share of the operations connections' time.
	OpsShare float64
}

// Handler returns the endpoints' mux.
func Handler(d Deps) http.Handler {
	mux := http.NewServeMux()
	toks := newTokens(append([]Token{{Name: "default", Value: d.AuthToken}}, d.Tokens...))
	guarded := func(pattern string, h http.HandlerFunc) { mux.HandleFunc(pattern, requireToken(toks, h)) }
	payloads := guarded
	if d.OffLoopback && len(toks.sums) == 0 {
		payloads = func(pattern string, _ http.HandlerFunc) { mux.HandleFunc(pattern, refusePayloads) }
	}
	lim := newLimit(d.MaxConcurrent, d.OpsShare)
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		code, out := http.StatusOK, map[string]string{}
		for name, check := range d.Checks {
			if err := check(ctx); err != nil {
				code, out[name] = http.StatusServiceUnavailable, err.Error()
				continue
			}
			out[name] = "ok"
		}
		writeJSON(w, code, out)
	})
	if d.Registry != nil {
		h := promhttp.HandlerFor(d.Registry, promhttp.HandlerOpts{Registry: d.Registry})
		guarded("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
			if place, _, ok := lim.try(); d.BeforeScrape != nil && ok {
				began := lim.clock()
				ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
				d.BeforeScrape(ctx)
				cancel()
				lim.release(place, lim.clock().Sub(began))
			} else if ok {
				lim.release(place, 0)
			}
			h.ServeHTTP(w, r)
		})
	}
	guarded("GET /status", lim.wrap(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		st, err := d.Status(ctx)
		if err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, st)
	}))
	if d.Dead != nil {
		payloads("GET /dead", lim.wrap(func(w http.ResponseWriter, r *http.Request) { serveDead(w, r, d.Dead) }))
		payloads("GET /dead/{id}", lim.wrap(func(w http.ResponseWriter, r *http.Request) { serveDeadRow(w, r, d.Dead) }))
	}
	if d.Admin != nil && d.Dead != nil {
		adminRoutes(d.Admin, d.Dead,
			func(p string, h http.HandlerFunc) { guarded(p, lim.wrap(h)) },
			func(p string, h http.HandlerFunc) { payloads(p, lim.wrap(h)) },
			func(p string, h func(http.ResponseWriter, *http.Request, admin.Caller)) {
				mux.HandleFunc(p, requireWriter(toks, h))
			})
	}
	if d.UI != nil {
		ui := d.UI(lim.wrapAs)
		mux.Handle("/ui", ui)
		mux.Handle("/ui/", ui)
	}
	if d.Pprof {
		payloads("GET /debug/pprof/", pprof.Index)
		payloads("GET /debug/pprof/cmdline", pprof.Cmdline)
		payloads("GET /debug/pprof/profile", pprof.Profile)
		payloads("GET /debug/pprof/symbol", pprof.Symbol)
		payloads("GET /debug/pprof/trace", pprof.Trace)
	}
	return mux
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// Timeouts bound what a slow or idle client can hold on the operations port;
// probes and scrapes are small requests. Zero fields get the defaults.
type Timeouts struct {
	ReadHeader time.Duration // 5 s
	Read       time.Duration // 10 s: the whole request
	Write      time.Duration // 30 s: /status and /metrics read Postgres and Redis within their own 2-3 s
	Idle       time.Duration // 60 s: a keep-alive connection without a request
}

// Server returns the HTTP server for h with t's timeouts applied.
func Server(h http.Handler, t Timeouts) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: cmp.Or(t.ReadHeader, 5*time.Second),
		ReadTimeout:       cmp.Or(t.Read, 10*time.Second),
		WriteTimeout:      cmp.Or(t.Write, 30*time.Second),
		IdleTimeout:       cmp.Or(t.Idle, 60*time.Second),
	}
}
