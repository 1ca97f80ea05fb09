package webhook_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/dispatch/webhook"
)

// heldReceiver answers every request with raw and then keeps the
// connection open without sending anything more, until the test ends.
func heldReceiver(t *testing.T, raw string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					if _, err := io.WriteString(c, raw); err != nil {
						return
					}
				}
			})
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return "http://" + ln.Addr().String() + "/events"
}

// A 101 or an interim answer other than 100/103 is a failed, retryable
// attempt at once, however long the peer keeps the socket open; 100 and 103
// followed by a 2xx are a delivery.
func TestInterimAnswersAreFailedAttempts(t *testing.T) {
	for _, c := range []struct {
		name, raw string
		ok        bool
	}{
		{"101 held", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", false},
		{"102 held", "HTTP/1.1 102 Processing\r\n\r\n", false},
		{"199 held", "HTTP/1.1 199 Whatever\r\n\r\n", false},
		{"103 then 204", "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n", true},
		{"100 then 204", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			w, err := webhook.New(webhook.Config{URL: heldReceiver(t, c.raw), Timeout: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			// A deadline far beyond the answer: only the answer itself may
			// end the send (a send ended by the deadline is not ErrInterim).
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err = w.SendEvent(ctx, event(), 1)
			if c.ok {
				if err != nil {
					t.Fatalf("want delivered, got %v", err)
				}
				return
			}
			var de *dispatch.Error
			if !errors.Is(err, dispatch.ErrInterim) || !errors.As(err, &de) || de.Permanent || !de.Unanswered {
				t.Fatalf("want a retryable, unanswered ErrInterim; got %#v (%v)", de, err)
			}
			if r := dispatch.Failed(err); r.Outcome != dispatch.Retryable || !r.Unanswered {
				t.Fatalf("Failed(err) = %+v, want Retryable and Unanswered", r)
			}
		})
	}
}

// A receiver that reads the request and never answers: the send ends with
// its context, marked Unanswered (the destination held it); a send that
// never reached a receiver is not.
func TestHeldSocketIsUnanswered(t *testing.T) {
	w, err := webhook.New(webhook.Config{URL: heldReceiver(t, ""), Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	var de *dispatch.Error
	if err := w.SendEvent(ctx, event(), 1); !errors.As(err, &de) || !de.Unanswered || de.Permanent {
		t.Fatalf("held socket: want a retryable, unanswered error; got %v", err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // nobody listens: the request is never written
	w, err = webhook.New(webhook.Config{URL: "http://" + addr + "/events", Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.SendEvent(context.Background(), event(), 1); !errors.As(err, &de) || de.Unanswered {
		t.Fatalf("refused connection: want an error not marked unanswered; got %v", err)
	}
}
