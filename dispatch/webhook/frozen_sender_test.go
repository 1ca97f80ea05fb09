package webhook_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/dispatch/webhook"
)

// unfiredDeadline is a context whose deadline has passed while its
// cancellation has not landed yet: what a sender frozen (GC, SIGSTOP) past
// its deadline sees when it resumes, before the runtime ran the context's
// timer. Only the write-time check can stop such a sender; with a real
// context the transport's own cancellation races it and hides its absence.
type unfiredDeadline struct {
	context.Context // cancelled at the test's end only
	at              time.Time
}

func (c unfiredDeadline) Deadline() (time.Time, bool) { return c.at, true }

func newUnfiredDeadline(t *testing.T, at time.Time) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return unfiredDeadline{Context: ctx, at: at}
}

// untilPast blocks until the wall clock is past at: the sender's freeze.
func untilPast(at time.Time) {
	for d := time.Until(at); d >= 0; d = time.Until(at) {
		time.Sleep(d + time.Millisecond)
	}
}

// A sender frozen after its last deadline check, with the request's headers
// already buffered, writes nothing when it resumes past the trust deadline:
// the connection refuses the write (ErrDeadlinePassed) and the receiver
// sees a connection close without a byte of request.
func TestFrozenSenderWritesNothingPastTheDeadline(t *testing.T) {
	var hits atomic.Int32
	closed := make(chan struct{}, 4)
	var active atomic.Int32 // connections that carried request bytes
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateActive:
			active.Add(1)
		case http.StateClosed, http.StateHijacked:
			closed <- struct{}{}
		}
	}
	srv.Start()
	defer srv.Close()
	w, err := webhook.New(webhook.Config{URL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}

	// The caller checked the deadline (it is ahead) and sends; the sender
	// then freezes in the transport's write loop, after the connection was
	// armed and the headers buffered, until the deadline has passed.
	until := time.Now().Add(100 * time.Millisecond)
	var froze atomic.Bool
	trace := &httptrace.ClientTrace{WroteHeaders: func() {
		froze.Store(true)
		untilPast(until)
	}}
	ctx := httptrace.WithClientTrace(newUnfiredDeadline(t, until), trace)
	err = w.SendEvent(ctx, event(), 1)
	if !froze.Load() {
		t.Fatalf("the sender never reached the freeze point (err %v)", err)
	}
	if err == nil {
		t.Fatalf("a sender past its deadline delivered: the receiver got %d requests", hits.Load())
	}
	if !errors.Is(err, dispatch.ErrDeadlinePassed) {
		t.Errorf("send past the deadline: err %v, want ErrDeadlinePassed", err)
	}
	if dispatch.IsPermanent(err) {
		t.Errorf("a refused write is the deadline's doing, not the receiver's: %v is permanent", err)
	}
	// The server closes its side once it reads the client's close: by then
	// it has seen every byte the client wrote.
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the receiver never saw the connection close")
	}
	if n, a := hits.Load(), active.Load(); n != 0 || a != 0 {
		t.Fatalf("the receiver got %d requests (%d connections with request bytes) from a sender past its deadline, want none", n, a)
	}
}
