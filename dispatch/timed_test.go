package dispatch_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/dispatch"
)

// Each failure a webhook meets is classified into its bounded reason: the
// receiver's status class, a timeout, a refused or a broken connection.
func TestFailureReasonOfWebhookFailures(t *testing.T) {
	status := func(code int) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(code) }))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	// Accepts connections and answers nothing until the test ends.
	hang, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer hang.Close()
	wg.Go(func() {
		var held []net.Conn
		for {
			c, err := hang.Accept()
			if err != nil {
				for _, c := range held {
					c.Close()
				}
				return
			}
			held = append(held, c)
		}
	})
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusedURL := "http://" + closed.Addr().String() + "/x"
	closed.Close()
	drop, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer drop.Close()
	wg.Go(func() {
		for {
			c, err := drop.Accept()
			if err != nil {
				return
			}
			buf := make([]byte, 1024)
			_, _ = c.Read(buf)
			c.Close() // read the request, answer nothing
		}
	})
	for _, tc := range []struct{ url, want string }{
		{status(503), dispatch.ReasonHTTP5xx}, {status(429), dispatch.ReasonHTTP4xx}, {status(404), dispatch.ReasonHTTP4xx},
		{status(302), dispatch.ReasonHTTP3xx}, {"http://" + hang.Addr().String() + "/x", dispatch.ReasonTimeout}, {refusedURL, dispatch.ReasonRefused},
		{"http://" + drop.Addr().String() + "/x", dispatch.ReasonConnection},
	} {
		w, err := dispatch.NewWebhook(dispatch.WebhookConfig{URL: tc.url, Timeout: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		err = w.SendEvent(context.Background(), event(), 1)
		if got := dispatch.FailureReason(err); got != tc.want {
			t.Errorf("%s: %v: reason %q, want %q", tc.url, err, got, tc.want)
		}
	}
}

type observed struct {
	mu   sync.Mutex
	seen map[string]int
}

func (o *observed) observe(outcome string, took time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.seen[outcome]++
}

// Timed observes each request of a per-event sink once, with its outcome,
// and a batch sink's call once; events never attempted are not observed.
func TestTimedObservesEachSend(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Idempotency-Key") == "2" {
			w.WriteHeader(500)
		}
	}))
	defer srv.Close()
	w, err := dispatch.NewWebhook(dispatch.WebhookConfig{URL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	o := &observed{seen: map[string]int{}}
	ev := func(id int64, agg string) dispatch.Event {
		e := event()
		e.ID, e.AggregateID = id, agg
		return e
	}
	batch := dispatch.Batch{Events: []dispatch.Event{ev(1, "a"), ev(2, "b"), ev(3, "b"), ev(4, "c")}, Token: 1,
		Until: func() time.Time { return time.Now().Add(time.Minute) }}
	out := dispatch.Timed(w, o.observe).Send(context.Background(), batch)
	if out[2].Outcome != dispatch.NotAttempted {
		t.Fatalf("results %v", out)
	}
	if o.seen[dispatch.SendDelivered] != 2 || o.seen[dispatch.SendRetryable] != 1 || len(o.seen) != 2 {
		t.Fatalf("per-event sink observed %v, want 2 delivered and 1 retryable", o.seen)
	}
	o = &observed{seen: map[string]int{}}
	dispatch.Timed(dispatch.Noop{}, o.observe).Send(context.Background(), batch)
	if o.seen[dispatch.SendDelivered] != 1 || len(o.seen) != 1 {
		t.Fatalf("batch sink observed %v, want its one call", o.seen)
	}
}
