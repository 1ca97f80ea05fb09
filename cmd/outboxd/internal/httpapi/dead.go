package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/deadquery"
	"github.com/outboxd/outboxd/store"
)

// DeadLister reads the dead-letter list and one dead row with its attempt
// history (store.Ops does). Called from one goroutine per request.
type DeadLister interface {
	ListDead(ctx context.Context, q store.DeadQuery) (store.DeadPage, error)
	ShowDead(ctx context.Context, id int64) (store.DeadEvent, error)
	History(ctx context.Context, id int64, createdAt pgtype.Timestamptz) ([]store.Attempt, error)
}

// DeadShown is one dead row as GET /dead/{id} and `outboxd dead show
// --json` print it: the row and its last failed attempts.
type DeadShown struct {
	store.DeadEvent
	History []store.Attempt `json:"history"`
}

// serveDeadRow answers GET /dead/{id} with the row (DeadShown): 400 for an
// id that is not a whole number, 404 when no dead row has it (missing,
// pending or delivered), 503 when Postgres does not answer.
func serveDeadRow(w http.ResponseWriter, r *http.Request, d DeadLister) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		badParam(w, "id", errors.New("want an outbox id (a whole number)"))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	e, err := d.ShowDead(ctx, id)
	var hist []store.Attempt
	if err == nil {
		hist, err = d.History(ctx, e.ID, e.CreatedAt)
	}
	switch {
	case errors.Is(err, store.ErrNoRow), errors.Is(err, store.ErrNotDead):
		writeJSON(w, http.StatusNotFound, map[string]string{"error": err.Error()})
	case err != nil:
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
	default:
		writeJSON(w, http.StatusOK, DeadShown{e, hist})
	}
}

// serveDead answers GET /dead with one page of the list as JSON
// (store.DeadPage), taking the filters and paging of `outboxd dead list`
// as query parameters of the same names. An unknown, repeated or invalid
// parameter is a 400 naming it: a typo must not widen the list silently.
func serveDead(w http.ResponseWriter, r *http.Request, d DeadLister) {
	params := r.URL.Query()
	for name, vs := range params {
		switch {
		case !deadquery.Known(name):
			badParam(w, name, fmt.Errorf("unknown parameter (known: %v)", deadquery.All))
			return
		case len(vs) > 1:
			badParam(w, name, errors.New("given more than once"))
			return
		}
	}
	q, err := deadquery.Parse(func(name string) (string, bool) {
		vs, ok := params[name]
		if !ok {
			return "", false
		}
		return vs[0], true
	}, time.Now())
	var pe *deadquery.ParamError
	if errors.As(err, &pe) {
		badParam(w, pe.Name, pe.Err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	page, err := d.ListDead(ctx, store.DeadQuery{Filter: q.Filter, After: q.After, Limit: q.Limit})
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, page)
}

func badParam(w http.ResponseWriter, name string, err error) {
	writeJSON(w, http.StatusBadRequest, map[string]string{
		"error": fmt.Sprintf("query parameter %q: %v", name, err), "parameter": name,
	})
}
