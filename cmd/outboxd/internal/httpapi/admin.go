package httpapi

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/admin"
	"github.com/outboxd/outboxd/cmd/outboxd/internal/deadquery"
)

// maxAdminBody bounds a write's JSON body.
const maxAdminBody = 64 << 10

// adminWriteTimeout bounds a write: its wait for lock:reconciliation
// (lock-wait, 30 s by default) and its batches.
const adminWriteTimeout = 5 * time.Minute

// adminRoutes registers the admin API (docs/reference.md, "Admin API"):
// reads behind read (the token when one is set), writes behind write (a
// named token always, on any address).
func adminRoutes(s *admin.Service, dead DeadLister, read, payloads func(string, http.HandlerFunc), write func(string, func(http.ResponseWriter, *http.Request, admin.Caller))) {
	read("GET /admin/status", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		st, err := s.Status(ctx)
		answer(w, st, err)
	})
	read("GET /admin/destinations", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		ds, err := s.Destinations(ctx)
		answer(w, ds, err)
	})
	payloads("GET /admin/dead", func(w http.ResponseWriter, r *http.Request) { serveDead(w, r, dead) })
	payloads("GET /admin/dead/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
		if err != nil {
			badParam(w, "id", errors.New("want an outbox id (a whole number)"))
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		row, err := s.DeadShow(ctx, id)
		answer(w, row, err)
	})
	write("POST /admin/pause", func(w http.ResponseWriter, r *http.Request, who admin.Caller) {
		pauseWrite(w, r, who, s.Pause)
	})
	write("POST /admin/resume", func(w http.ResponseWriter, r *http.Request, who admin.Caller) {
		pauseWrite(w, r, who, s.Resume)
	})
	write("POST /admin/replay", func(w http.ResponseWriter, r *http.Request, who admin.Caller) {
		deadWrite(w, r, who, s.Replay)
	})
	write("POST /admin/discard", func(w http.ResponseWriter, r *http.Request, who admin.Caller) {
		deadWrite(w, r, who, s.Discard)
	})
	write("POST /admin/resend", func(w http.ResponseWriter, r *http.Request, who admin.Caller) {
		p, ok := readParams(w, r, admin.ResendParams)
		if !ok {
			return
		}
		req, err := p.Resend(time.Now())
		if badRequest(w, err) {
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), adminWriteTimeout)
		defer cancel()
		res, err := s.Resend(ctx, who, req)
		answer(w, res, err)
	})
}

func pauseWrite(w http.ResponseWriter, r *http.Request, who admin.Caller, do func(context.Context, admin.Caller, admin.PauseRequest) (admin.PauseResult, error)) {
	p, ok := readParams(w, r, admin.PauseParams)
	if !ok {
		return
	}
	req, err := p.Pause()
	if badRequest(w, err) {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), adminWriteTimeout)
	defer cancel()
	res, err := do(ctx, who, req)
	answer(w, res, err)
}

func deadWrite(w http.ResponseWriter, r *http.Request, who admin.Caller, do func(context.Context, admin.Caller, admin.DeadWriteRequest) (admin.DeadWriteResult, error)) {
	p, ok := readParams(w, r, admin.DeadWriteParams)
	if !ok {
		return
	}
	req, err := p.DeadWrite(time.Now())
	if badRequest(w, err) {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), adminWriteTimeout)
	defer cancel()
	res, err := do(ctx, who, req)
	answer(w, res, err)
}

// readParams reads a write's JSON body; a bad one is answered 400.
func readParams(w http.ResponseWriter, r *http.Request, known []string) (admin.Params, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxAdminBody))
	if err != nil {
		badParam(w, "body", err)
		return nil, false
	}
	p, err := admin.DecodeParams(body, known)
	return p, !badRequest(w, err)
}

// badRequest answers 400 naming the parameter of a *deadquery.ParamError.
func badRequest(w http.ResponseWriter, err error) bool {
	var pe *deadquery.ParamError
	if errors.As(err, &pe) {
		badParam(w, pe.Name, pe.Err)
		return true
	}
	return false
}

// answer writes v, or err's status: 400 invalid, 404 not found, 409 a
// stale fence (lock:reconciliation taken over: nothing more changed), 423
// the lock held elsewhere past lock-wait, 503 otherwise. A write that
// stopped midway answers its partial result beside the error.
func answer(w http.ResponseWriter, v any, err error) {
	code := http.StatusOK
	switch {
	case err == nil:
		writeJSON(w, code, v)
		return
	case errors.Is(err, admin.ErrInvalid):
		code = http.StatusBadRequest
	case errors.Is(err, admin.ErrNotFound):
		code = http.StatusNotFound
	case errors.Is(err, admin.ErrStale):
		code = http.StatusConflict
	case errors.Is(err, admin.ErrBusy):
		code = http.StatusLocked
	default:
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, map[string]any{"error": err.Error(), "result": v})
}
