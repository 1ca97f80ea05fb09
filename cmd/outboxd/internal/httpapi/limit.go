package httpapi

import "net/http"

// limit admits at most its capacity of the operations requests that read
// Postgres at once (/dead, /dead/{id}, /status, the backlog refresh of a
// scrape). Guarantee: a request beyond the capacity never waits for a
// connection: it is answered 503 with Retry-After at once, so a crowd of
// readers holds at most the capacity of the operations pool's connections
// and never queues behind a slow query. A nil limit admits everything.
type limit chan struct{}

// retryAfter is the Retry-After (seconds) of a request refused by a full limit.
const retryAfter = "1"

func newLimit(n int) limit {
	if n <= 0 {
		return nil
	}
	return make(limit, n)
}

// try takes a place, or reports false when every place is taken; release
// gives it back.
func (l limit) try() bool {
	if l == nil {
		return true
	}
	select {
	case l <- struct{}{}:
		return true
	default:
		return false
	}
}

func (l limit) release() {
	if l != nil {
		<-l
	}
}

// wrap serves h within the limit, and 503 with Retry-After when it is full.
func (l limit) wrap(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !l.try() {
			w.Header().Set("Retry-After", retryAfter)
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{
				"error": "too many operations requests reading Postgres at once (http.max_concurrent); retry later",
			})
			return
		}
		defer l.release()
		h(w, r)
	}
}
