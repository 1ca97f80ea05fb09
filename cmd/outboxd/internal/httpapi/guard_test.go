package httpapi_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/httpapi"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/store"
)

// deadRow is a store holding one dead row, and that row's id.
func deadRow(t *testing.T) (*store.Store, string) {
	t.Helper()
	st, _ := testenv.Store(t)
	var id string
	err := st.Pool().QueryRow(context.Background(), `
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, attempts, last_error, dead_at)
VALUES ('deal', '1', 'deal.funded', '{"iban": "DE89370400440532013000"}', 25, 'HTTP 500', now())
RETURNING id::text`).Scan(&id)
	if err != nil {
		t.Fatal(err)
	}
	return st, id
}

// ask serves one GET of path with the Authorization header (none when
// empty) and returns the answer.
func ask(h http.Handler, path, authorization string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, path, nil)
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func noStatus(context.Context) (any, error) { return map[string]string{}, nil }

// With http.auth_token, every path that serves a payload or the process's
// internals (a dead row with its payload, pprof's pages) answers 401
// without the bearer token or with another one, and serves with it.
func TestTokenGuardsPayloadsAndPprof(t *testing.T) {
	t.Parallel()
	st, id := deadRow(t)
	h := httpapi.Handler(httpapi.Deps{Dead: st.Ops(), Pprof: true, AuthToken: "s3cret", Status: noStatus})
	for _, path := range []string{"/dead/" + id, "/dead", "/debug/pprof/", "/debug/pprof/cmdline", "/debug/pprof/symbol"} {
		for _, bad := range []string{"", "Bearer wrong", "Basic czNjcmV0", "s3cret", "Bearers3cret"} {
			if rec := ask(h, path, bad); rec.Code != http.StatusUnauthorized || strings.Contains(rec.Body.String(), "DE89") {
				t.Errorf("GET %s with Authorization %q: %d, want 401: %.200s", path, bad, rec.Code, rec.Body)
			}
		}
		if rec := ask(h, path, "Bearer s3cret"); rec.Code != http.StatusOK {
			t.Errorf("GET %s with the token: %d, want 200: %.200s", path, rec.Code, rec.Body)
		}
	}
}

// The bearer scheme's name is case-insensitive (RFC 7235): "bearer" and
// "BEARER" carry the token as well as "Bearer" does.
func TestBearerSchemeInAnyCase(t *testing.T) {
	t.Parallel()
	h := httpapi.Handler(httpapi.Deps{AuthToken: "s3cret", Status: noStatus})
	for _, scheme := range []string{"Bearer", "bearer", "BEARER", "bEaReR"} {
		if rec := ask(h, "/status", scheme+" s3cret"); rec.Code != http.StatusOK {
			t.Errorf("Authorization %q: %d, want 200", scheme+" s3cret", rec.Code)
		}
		if rec := ask(h, "/status", scheme+" S3CRET"); rec.Code != http.StatusUnauthorized {
			t.Errorf("Authorization %q: %d, want 401 (the token itself is case-sensitive)", scheme+" S3CRET", rec.Code)
		}
	}
}

// Off loopback without a token, /dead, /dead/{id} and pprof answer 403
// naming http.auth_token_file, and no payload; /metrics, /livez, /readyz
// and /status serve as before. With a token they serve to its bearer.
func TestPayloadsRefusedOffLoopbackWithoutToken(t *testing.T) {
	t.Parallel()
	st, id := deadRow(t)
	deps := httpapi.Deps{Dead: st.Ops(), Pprof: true, OffLoopback: true, Status: noStatus}
	h := httpapi.Handler(deps)
	for _, path := range []string{"/dead", "/dead/" + id, "/debug/pprof/", "/debug/pprof/cmdline"} {
		rec := ask(h, path, "")
		if rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), "http.auth_token_file") || strings.Contains(rec.Body.String(), "DE89") {
			t.Errorf("GET %s off loopback without a token: %d %.200s, want 403 naming http.auth_token_file", path, rec.Code, rec.Body)
		}
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Errorf("GET %s: Content-Type %q, want application/json", path, ct)
		}
	}
	for _, path := range []string{"/livez", "/readyz", "/status"} {
		if rec := ask(h, path, ""); rec.Code != http.StatusOK {
			t.Errorf("GET %s off loopback without a token: %d, want 200", path, rec.Code)
		}
	}
	deps.AuthToken = "s3cret"
	h = httpapi.Handler(deps)
	if rec := ask(h, "/dead/"+id, "Bearer s3cret"); rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "DE89") {
		t.Errorf("GET /dead/%s off loopback with the token: %d, want 200 with the payload", id, rec.Code)
	}
	deps.AuthToken, deps.OffLoopback = "", false
	h = httpapi.Handler(deps)
	if rec := ask(h, "/dead/"+id, ""); rec.Code != http.StatusOK {
		t.Errorf("GET /dead/%s on loopback without a token: %d, want 200", id, rec.Code)
	}
}

// Loopback is judged by the listen address: 127.0.0.0/8, ::1 and
// "localhost"; every interface (empty host, 0.0.0.0, ::) and any other
// host are not.
func TestLoopback(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]bool{
		"127.0.0.1:9090": true, "127.8.9.10:9090": true, "[::1]:9090": true, "localhost:9090": true,
		":9090": false, "0.0.0.0:9090": false, "[::]:9090": false, "10.0.0.7:9090": false,
		"[fe80::1]:9090": false, "example.com:9090": false, "localhost.example.com:9090": false,
	} {
		if got := httpapi.Loopback(addr); got != want {
			t.Errorf("Loopback(%q) = %t, want %t", addr, got, want)
		}
	}
}

// Beyond http.max_concurrent, a request that reads Postgres is answered
// 503 with Retry-After at once (it does not queue); a scrape still serves
// the metrics, without refreshing them; once a place is free, requests
// are served again.
func TestConcurrencyLimitAnswers503WithRetryAfter(t *testing.T) {
	t.Parallel()
	st, id := deadRow(t)
	entered, release := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	status := func(ctx context.Context) (any, error) {
		if first.CompareAndSwap(false, true) { // the request holding the place
			close(entered)
			<-release
		}
		return map[string]string{}, nil
	}
	scrapes := 0
	h := httpapi.Handler(httpapi.Deps{
		Dead: st.Ops(), Status: status, MaxConcurrent: 1, Registry: prometheus.NewRegistry(),
		BeforeScrape: func(context.Context) { scrapes++ },
	})
	held := make(chan *httptest.ResponseRecorder)
	go func() { held <- ask(h, "/status", "") }()
	<-entered
	for _, path := range []string{"/status", "/dead", "/dead/" + id} {
		rec := ask(h, path, "")
		if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" {
			t.Errorf("GET %s beyond the limit: %d, Retry-After %q; want 503 with Retry-After", path, rec.Code, rec.Header().Get("Retry-After"))
		}
	}
	if rec := ask(h, "/metrics", ""); rec.Code != http.StatusOK || scrapes != 0 {
		t.Errorf("GET /metrics beyond the limit: %d after %d refreshes, want 200 without a refresh", rec.Code, scrapes)
	}
	close(release)
	if rec := <-held; rec.Code != http.StatusOK {
		t.Errorf("the request within the limit: %d, want 200", rec.Code)
	}
	for _, path := range []string{"/status", "/dead", "/dead/" + id, "/metrics"} {
		if rec := ask(h, path, ""); rec.Code != http.StatusOK {
			t.Errorf("GET %s with the limit free: %d, want 200: %.200s", path, rec.Code, rec.Body)
		}
	}
	if scrapes != 1 {
		t.Errorf("%d backlog refreshes, want 1 (the scrape with the limit free)", scrapes)
	}
}
