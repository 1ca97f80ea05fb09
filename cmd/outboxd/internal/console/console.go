// Package console serves the operations console at /ui on the ops port:
// server-rendered pages (html/template, embedded with the binary, no
// script needed to read them) showing the leader, the replicas, the
// destinations with their circuits, pauses and a chart of the relay's own
// counters, and the dead letters with their attempt history; and forms,
// behind http.auth_token and CSRF protection, that pause and resume a
// destination and replay, discard or resend rows after a confirmation
// showing how many they select. The writes are the operator controls of
// package admin, fenced as the CLI's commands.
package console

import (
	"context"
	"embed"
	"errors"
	"html/template"
	"log/slog"
	"net/http"
	"time"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/admin"
	"github.com/outboxd/outboxd/store"
)

//go:embed templates/*.html static/*
var files embed.FS

// Backend reads and changes what the console shows: the operator
// controls (*admin.Service, each write fenced as its CLI command) and the
// overview. Called from one goroutine per request.
type Backend interface {
	Overview(ctx context.Context) (Overview, error)
	DeadList(ctx context.Context, req admin.DeadListRequest) (store.DeadPage, error)
	DeadShow(ctx context.Context, id int64) (admin.DeadShown, error)
	Pause(ctx context.Context, who admin.Caller, req admin.PauseRequest) (admin.PauseResult, error)
	Resume(ctx context.Context, who admin.Caller, req admin.PauseRequest) (admin.PauseResult, error)
	Replay(ctx context.Context, who admin.Caller, req admin.DeadWriteRequest) (admin.DeadWriteResult, error)
	Discard(ctx context.Context, who admin.Caller, req admin.DeadWriteRequest) (admin.DeadWriteResult, error)
	Resend(ctx context.Context, who admin.Caller, req admin.ResendRequest) (admin.ResendResult, error)
}

// Overview is the first page: who leads, the replicas, the destinations
// and the backlog.
type Overview struct {
	Leader       Leader
	Replicas     []store.Replica
	Destinations []Destination
	Backlog      store.Stats
	BacklogAt    time.Time // when the backlog was counted
	FetchError   string
}

// Leader is the holder of lock:outbox:poller: its instance_id ("" when no
// replica leads), its fencing token as Postgres last accepted it, and the
// lease backend's counter of tokens issued.
type Leader struct {
	Instance     string
	FenceToken   int64
	RedisCounter int64
	TTL          time.Duration
	Error        string
}

// Destination is one destination as the console shows it.
type Destination struct {
	Name, Sink   string
	Circuit      string // "open" or "closed"
	CircuitSince time.Time
	CircuitError string
	Paused       bool
	PausedAt     time.Time
	// Backlog and Lag (seconds) are its pending rows and the age of the
	// oldest; HasBacklog is false when they are not counted per destination.
	Backlog    int64
	Lag        float64
	HasBacklog bool
}

// Deps are what the console needs.
type Deps struct {
	Backend Backend
	Samples *Ring
	// Tokens are the bearer tokens a browser signs in with: http.auth_token
	// (named "default") and http.auth_tokens_file's. With any, every page
	// but the login asks for one once (a session cookie naming it) and the
	// forms that change anything are served, each write logged with the
	// token's name; with none the console only reads.
	Tokens []Token
	// OffLoopback: http.addr is reachable from other hosts; without a
	// token the dead letters are then not shown, as /dead answers 403.
	OffLoopback bool
	Log         *slog.Logger
	Now         func() time.Time // time.Now when nil
	// Bound wraps each page that reads Postgres or Redis in the
	// operations requests' limit (http.max_concurrent and its share of
	// time), which answers a request beyond it with busy. The sign-in form,
	// the style sheet and the writes are served outside it: a write is an
	// operator's, signed in, and its time is mostly spent waiting for a
	// lock or the leader, on the operations pool. nil: unbounded.
	Bound func(h http.HandlerFunc, busy func(w http.ResponseWriter, r *http.Request, retry time.Duration)) http.HandlerFunc
}

// Handler serves the console under /ui.
func Handler(d Deps) http.Handler {
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Bound == nil {
		d.Bound = func(h http.HandlerFunc, _ func(http.ResponseWriter, *http.Request, time.Duration)) http.HandlerFunc {
			return h
		}
	}
	s := &server{d: d, g: newGuard(d.Tokens, d.Now), pages: parsePages()}
	mux := http.NewServeMux()
	mux.Handle("GET /ui/static/", http.StripPrefix("/ui", http.FileServerFS(files)))
	mux.HandleFunc("GET /ui/login", s.loginPage)
	mux.HandleFunc("POST /ui/login", s.loginPost)
	mux.HandleFunc("POST /ui/logout", s.write(s.logoutPost))
	b := func(h http.HandlerFunc) http.HandlerFunc { return d.Bound(h, s.busy) }
	mux.HandleFunc("GET /ui", s.read(b(s.overview)))
	mux.HandleFunc("GET /ui/{$}", s.read(b(s.overview)))
	mux.HandleFunc("GET /ui/dead", s.read(s.deadOnly(b(s.deadList))))
	mux.HandleFunc("GET /ui/dead/{id}", s.read(s.deadOnly(b(s.deadRow))))
	mux.HandleFunc("GET /ui/confirm/{op}", s.read(s.deadOnly(b(s.confirm))))
	mux.HandleFunc("GET /ui/resend", s.read(s.deadOnly(s.resendForm)))
	mux.HandleFunc("POST /ui/do/{op}", s.write(s.apply))
	mux.HandleFunc("POST /ui/pause/{name}", s.write(s.pause(true)))
	mux.HandleFunc("POST /ui/resume/{name}", s.write(s.pause(false)))
	return mux
}

// server holds the console's state: its dependencies, the guard and the
// parsed pages.
type server struct {
	d     Deps
	g     *guard
	pages map[string]*template.Template
}

// read serves h to a signed-in browser, or to anyone when no token is
// set; others are sent to the login page.
func (s *server) read(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.g.hasTok && !s.g.signedIn(r) {
			http.Redirect(w, r, "/ui/login?next="+template.URLQueryEscaper(r.URL.RequestURI()), http.StatusSeeOther)
			return
		}
		h(w, r)
	}
}

// write serves h only past the guard's write checks (writeRefusal).
func (s *server) write(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
		if why := s.g.writeRefusal(r); why != "" {
			s.message(w, r, http.StatusForbidden, "Refused", why)
			return
		}
		h(w, r)
	}
}

// deadOnly refuses the dead-letter pages where /dead refuses them: off
// loopback without a token.
func (s *server) deadOnly(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.d.OffLoopback && !s.g.hasTok {
			s.message(w, r, http.StatusForbidden, "Refused",
				"http.addr is not a loopback address and no token is set: set http.auth_token_file to show the dead letters here")
			return
		}
		h(w, r)
	}
}

// payloadsShown: r may see event payloads and headers: signed in, or on
// loopback with no token set (as /dead/{id} serves them).
func (s *server) payloadsShown(r *http.Request) bool {
	return s.g.signedIn(r) || (!s.g.hasTok && !s.d.OffLoopback)
}

// ctx bounds a page's reads.
func ctx(r *http.Request, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), d)
}

// errStatus is the answer for a backend error, as the admin API's: 400
// for an invalid request, 404 for a row that is not dead, 409 for a write
// refused by a newer fence, 423 while lock:reconciliation is held
// elsewhere, 503 for the rest (Postgres or Redis not answering).
func errStatus(err error) int {
	switch {
	case errors.Is(err, admin.ErrInvalid):
		return http.StatusBadRequest
	case errors.Is(err, admin.ErrNotFound), errors.Is(err, store.ErrNoRow), errors.Is(err, store.ErrNotDead):
		return http.StatusNotFound
	case errors.Is(err, admin.ErrStale):
		return http.StatusConflict
	case errors.Is(err, admin.ErrBusy):
		return http.StatusLocked
	}
	return http.StatusServiceUnavailable
}

// Token is a bearer token and its name.
type Token struct{ Name, Value string }

// caller is who r's writes are logged as: "console:" and the name of the
// token its session was signed in with.
func (s *server) caller(r *http.Request) admin.Caller {
	return admin.Caller{Name: "console:" + s.g.who(r)}
}
