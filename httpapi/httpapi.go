// Package httpapi serves outboxd's operations endpoints: /livez, /readyz,
// /metrics and /status.
package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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
}

// Handler returns the endpoints' mux.
func Handler(d Deps) http.Handler {
	mux := http.NewServeMux()
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
		mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
			if d.BeforeScrape != nil {
				ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
				d.BeforeScrape(ctx)
				cancel()
			}
			h.ServeHTTP(w, r)
		})
	}
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		st, err := d.Status(ctx)
		if err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, st)
	})
	return mux
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
