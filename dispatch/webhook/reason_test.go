package webhook_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/dispatch/webhook"
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
		w, err := webhook.New(webhook.Config{URL: tc.url, Timeout: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		err = w.SendEvent(context.Background(), event(), 1)
		if got := dispatch.FailureReason(err); got != tc.want {
			t.Errorf("%s: %v: reason %q, want %q", tc.url, err, got, tc.want)
		}
	}
}
