package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/deadquery"
	"github.com/outboxd/outboxd/store"
)

// DeadLister reads a page of the dead-letter list (store.Store does).
// Called from one goroutine per request.
type DeadLister interface {
	ListDead(ctx context.Context, f store.DeadFilter, after *store.DeadCursor, limit int) (store.DeadPage, error)
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
	page, err := d.ListDead(ctx, q.Filter, q.After, q.Limit)
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
