package httpapi

import (
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// limit admits at most its capacity of the operations requests that read
// Postgres at once (/dead, /dead/{id}, /status, the backlog refresh of a
// scrape), and lets each place read for at most its share of the time.
// Guarantees: a request beyond the capacity never waits for a connection:
// it is answered 503 with Retry-After at once, so a crowd of readers holds
// at most the capacity of the operations pool's connections and never
// queues behind a slow query; and a place that served a request for d
// owes a rest of d×(1/share − 1), serving again only while it owes at most
// restBurst, so however many readers ask, the operations reads take at
// most share of each place's time (after a burst), and the rest of the
// host's CPU stays with delivery. A nil limit admits everything.
type limit struct {
	share float64
	now   func() time.Time
	mu    sync.Mutex
	busy  []bool
	free  []time.Time // when each place's owed rest ends
}

// maxRest bounds a place's rest after one slow request.
const maxRest = 10 * time.Second

// restBurst is the rest a place may owe and still serve: an operator's few
// requests in a row are served at once; a crowd's owed rest grows past it
// and is then paid.
const restBurst = time.Second

// newLimit is a limit of n places, each reading for at most share of its
// time (share ≤ 0 or ≥ 1: no rest); nil when n ≤ 0.
func newLimit(n int, share float64) *limit {
	if n <= 0 {
		return nil
	}
	return &limit{share: share, now: time.Now, busy: make([]bool, n), free: make([]time.Time, n)}
}

// try takes a free place and returns it, or reports false and how long
// until a place may be free; release gives the place back after took.
func (l *limit) try() (int, time.Duration, bool) {
	if l == nil {
		return -1, 0, true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now, wait := l.now(), maxRest
	for i := range l.busy {
		switch {
		case l.busy[i]:
			wait = min(wait, time.Second)
		case !l.free[i].After(now.Add(restBurst)):
			l.busy[i] = true
			return i, 0, true
		default:
			wait = min(wait, l.free[i].Sub(now.Add(restBurst)))
		}
	}
	return 0, wait, false
}

func (l *limit) release(place int, took time.Duration) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.busy[place] = false
	now := l.now()
	if l.share <= 0 || l.share >= 1 {
		l.free[place] = now
		return
	}
	rest := min(time.Duration(float64(took)*(1/l.share-1)), maxRest)
	l.free[place] = maxTime(l.free[place], now).Add(rest)
}

// wrap serves h within the limit, and 503 with Retry-After when it is full.
func (l *limit) wrap(h http.HandlerFunc) http.HandlerFunc { return l.wrapAs(h, busyJSON) }

// Busy answers a request the limit refused, after Retry-After is set to
// retry (whole seconds, at least one); it writes the status (503).
type Busy func(w http.ResponseWriter, r *http.Request, retry time.Duration)

func busyJSON(w http.ResponseWriter, _ *http.Request, _ time.Duration) {
	writeJSON(w, http.StatusServiceUnavailable, map[string]string{
		"error": "too many operations requests reading Postgres (http.max_concurrent); retry later",
	})
}

// wrapAs is wrap answering a refused request with busy.
func (l *limit) wrapAs(h http.HandlerFunc, busy Busy) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		place, wait, ok := l.try()
		if !ok {
			secs := math.Ceil(max(wait, time.Second).Seconds())
			w.Header().Set("Retry-After", strconv.Itoa(int(secs)))
			busy(w, r, time.Duration(secs)*time.Second)
			return
		}
		began := l.clock()
		defer func() { l.release(place, l.clock().Sub(began)) }()
		h(w, r)
	}
}

func (l *limit) clock() time.Time {
	if l == nil {
		return time.Time{}
	}
	return l.now()
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
