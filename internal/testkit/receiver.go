package testkit

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"
)

// BodyKeep is how much of each body a Receiver keeps: any small event
// whole, not the 10 MB ones.
const BodyKeep = 64 << 10

// Request is one request a Receiver got. Requests are kept in arrival order.
type Request struct {
	Seq     int       // arrival order, from 0
	At      time.Time // arrival
	Method  string
	Path    string
	Header  http.Header
	Body    []byte // the first BodyKeep bytes
	BodyLen int
	ID      int64  // the event's id, from the body (0: not an event)
	Agg     string // aggregate_type/aggregate_id, from the body
	Token   int64  // X-Fencing-Token (0: none)
	Attempt int    // requests for this ID so far, this one included
	Held    bool   // caught by a Hold
	Status  int    // the answer; 0 while held, or never answered (Hang, receiver closed)
}

// OK reports whether the request was answered 2xx: delivered.
func (r Request) OK() bool { return r.Status >= 200 && r.Status < 300 }

// Reply is a Receiver's answer to one request.
type Reply struct {
	Status int // 0 means 204
	Header http.Header
	Hang   bool // answer nothing until the client gives up or the receiver closes
}

// Receiver is a webhook receiver on a loopback port that records every
// request and answers as its respond function says (204 without one). It
// is closed at the test's cleanup, held and hanging requests released
// first.
type Receiver struct {
	srv  *httptest.Server
	quit chan struct{}

	mu       sync.Mutex
	reqs     []Request
	attempts map[int64]int
	ok       map[int64]int // 2xx answers per event id
	respond  func(Request) Reply
	holdIf   func(Request) bool
	release  chan struct{}
	held     int
	changed  chan struct{} // closed, then replaced, on every arrival and answer
}

// NewReceiver starts a Receiver, closed at t's cleanup.
func NewReceiver(t testing.TB) *Receiver {
	rc := &Receiver{quit: make(chan struct{}), attempts: map[int64]int{}, ok: map[int64]int{}}
	rc.srv = httptest.NewServer(rc)
	t.Cleanup(func() {
		close(rc.quit) // Close waits for handlers: let held and hanging ones go
		rc.srv.Close()
	})
	return rc
}

// URL is where to send events.
func (rc *Receiver) URL() string { return rc.srv.URL + "/events" }

// SetRespond sets how requests are answered from now on (nil: 204). f may
// run concurrently for several requests, without the receiver's lock; a
// held request is answered by the f set when it is released.
func (rc *Receiver) SetRespond(f func(Request) Reply) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.respond = f
}

// Statuses answers each aggregate listed with its status, others 204.
func Statuses(byAgg map[string]int) func(Request) Reply {
	return func(r Request) Reply { return Reply{Status: byAgg[r.Agg]} }
}

// Hold makes the requests match picks wait, unanswered, until release is
// called or the receiver closes, whatever their sender does meanwhile: a
// sender killed mid-request still has it answered and recorded, as a
// receiver that had processed it would. match runs with the receiver's
// lock held and must not call the Receiver. A new Hold replaces the last;
// release may be called more than once.
func (rc *Receiver) Hold(match func(Request) bool) (release func()) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	ch := make(chan struct{})
	rc.holdIf, rc.release, rc.held = match, ch, 0
	var once sync.Once
	return func() {
		once.Do(func() {
			rc.mu.Lock()
			if rc.release == ch {
				rc.holdIf, rc.release = nil, nil
			}
			rc.mu.Unlock()
			close(ch)
		})
	}
}

// HoldAggregate is a Hold matcher for one aggregate ("type/id").
func HoldAggregate(agg string) func(Request) bool {
	return func(r Request) bool { return r.Agg == agg }
}

// Held is how many requests the current (or last) Hold has caught.
func (rc *Receiver) Held() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.held
}

func (rc *Receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	req := Request{At: time.Now(), Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(),
		Body: bytes.Clone(body[:min(len(body), BodyKeep)]), BodyLen: len(body)}
	req.ID, req.Agg = eventOf(body)
	req.Token, _ = strconv.ParseInt(r.Header.Get("X-Fencing-Token"), 10, 64)

	rc.mu.Lock()
	req.Seq = len(rc.reqs)
	rc.attempts[req.ID]++
	req.Attempt = rc.attempts[req.ID]
	release := rc.release
	hold := rc.holdIf != nil && rc.holdIf(req)
	if hold {
		rc.held++
		req.Held = true
	}
	rc.reqs = append(rc.reqs, req)
	rc.notify()
	rc.mu.Unlock()

	if hold {
		select {
		case <-release:
		case <-rc.quit:
		}
	}
	rc.mu.Lock()
	respond := rc.respond
	rc.mu.Unlock()
	rep := Reply{}
	if respond != nil {
		rep = respond(req)
	}
	if rep.Hang {
		select {
		case <-r.Context().Done():
		case <-rc.quit:
		}
		return
	}
	status := cmp.Or(rep.Status, http.StatusNoContent)
	rc.mu.Lock()
	rc.reqs[req.Seq].Status = status
	if rc.reqs[req.Seq].OK() {
		rc.ok[req.ID]++
	}
	rc.notify()
	rc.mu.Unlock()
	for k, v := range rep.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(status)
}

// notify wakes the waiters; rc.mu is held.
func (rc *Receiver) notify() {
	if rc.changed != nil {
		close(rc.changed)
		rc.changed = nil
	}
}

// eventOf reads a webhook body's id and aggregate; zero values if it is
// not an event.
func eventOf(body []byte) (int64, string) {
	var ev struct {
		ID            int64  `json:"id"`
		AggregateType string `json:"aggregate_type"`
		AggregateID   string `json:"aggregate_id"`
	}
	if json.Unmarshal(body, &ev) != nil {
		return 0, ""
	}
	return ev.ID, ev.AggregateType + "/" + ev.AggregateID
}

// Requests returns a copy of the requests so far, in arrival order.
func (rc *Receiver) Requests() []Request {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]Request(nil), rc.reqs...)
}

// OKCounts returns how many 2xx answers each event id got.
func (rc *Receiver) OKCounts() map[int64]int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := make(map[int64]int, len(rc.ok))
	for id, n := range rc.ok {
		out[id] = n
	}
	return out
}

// Delivered is how many distinct events got a 2xx.
func (rc *Receiver) Delivered() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.ok)
}

// Await waits up to limit until cond holds, looking again at each arrival
// and answer (not on a timer), and reports whether it did. cond runs with
// the receiver's lock held on its own slice: it may read it, not keep it,
// and must not call the Receiver's methods.
func (rc *Receiver) Await(limit time.Duration, cond func(reqs []Request) bool) bool {
	timer := time.NewTimer(limit)
	defer timer.Stop()
	for {
		rc.mu.Lock()
		if cond(rc.reqs) {
			rc.mu.Unlock()
			return true
		}
		if rc.changed == nil {
			rc.changed = make(chan struct{})
		}
		changed := rc.changed
		rc.mu.Unlock()
		select {
		case <-changed:
		case <-timer.C:
			return false
		}
	}
}

// Wait is Await failing the test after limit, naming what it waited for.
func (rc *Receiver) Wait(t testing.TB, limit time.Duration, what string, cond func(reqs []Request) bool) {
	t.Helper()
	if !rc.Await(limit, cond) {
		t.Fatalf("after %s, still waiting for %s (%d requests, %d events delivered)", limit, what, len(rc.Requests()), rc.Delivered())
	}
}

// WaitDelivered waits until n distinct events got a 2xx.
func (rc *Receiver) WaitDelivered(t testing.TB, limit time.Duration, n int) {
	t.Helper()
	rc.Wait(t, limit, fmt.Sprintf("%d events delivered", n), func([]Request) bool { return len(rc.ok) >= n })
}

// InFlight reports whether a request no Hold caught is still unanswered
// (for Await's cond). A request answered with Hang stays in flight.
func InFlight(reqs []Request) bool {
	for _, r := range reqs {
		if r.Status == 0 && !r.Held {
			return true
		}
	}
	return false
}

// WaitHeld waits until the current Hold has caught n requests.
func (rc *Receiver) WaitHeld(t testing.TB, limit time.Duration, n int) {
	t.Helper()
	rc.Wait(t, limit, fmt.Sprintf("%d held requests", n), func([]Request) bool { return rc.held >= n })
}

// OrderViolations checks that each aggregate's events were first delivered
// (first 2xx) in id order, and says where not.
func OrderViolations(reqs []Request) []string {
	var out []string
	seen, last := map[int64]bool{}, map[string]int64{}
	for _, r := range reqs {
		if !r.OK() || seen[r.ID] {
			continue
		}
		seen[r.ID] = true
		if r.ID < last[r.Agg] {
			out = append(out, fmt.Sprintf("aggregate %s: event %d first delivered after %d", r.Agg, r.ID, last[r.Agg]))
		}
		last[r.Agg] = r.ID
	}
	return out
}

// TokenViolations checks that no request arriving from since on carries a
// fencing token lower than one that arrived before it (from since on), and
// says where one does.
func TokenViolations(reqs []Request, since time.Time) []string {
	var out []string
	var newest int64
	for _, r := range reqs {
		if r.At.Before(since) {
			continue
		}
		if r.Token < newest {
			out = append(out, fmt.Sprintf("event %d arrived with token %d after token %d", r.ID, r.Token, newest))
		}
		newest = max(newest, r.Token)
	}
	return out
}

// Tokens is how many distinct fencing tokens the requests carry: the
// number of terms that sent.
func Tokens(reqs []Request) int {
	seen := map[int64]bool{}
	for _, r := range reqs {
		seen[r.Token] = true
	}
	return len(seen)
}
