package httpapi_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/httpapi"
)

// serve runs Server(Handler) on a loopback port with short timeouts.
func serve(t *testing.T, to httpapi.Timeouts) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httpapi.Server(httpapi.Handler(httpapi.Deps{
		Checks: map[string]httpapi.Check{"ok": func(context.Context) error { return nil }},
	}), to)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// closedWithin reports whether the server closes c within d (reading until EOF).
func closedWithin(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return err == nil || !(errors.As(err, &ne) && ne.Timeout())
}

// A client cannot hold the operations port open: an idle keep-alive
// connection, a request whose headers never finish, and one whose body never
// finishes are all closed by the server.
func TestSlowAndIdleClientsAreCut(t *testing.T) {
	t.Parallel()
	const short = 300 * time.Millisecond
	addr := serve(t, httpapi.Timeouts{ReadHeader: short, Read: 2 * short, Idle: short})

	// Idle: one request on a keep-alive connection, then silence.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("readyz: %v %v", resp, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	if !closedWithin(c, 10*short) {
		t.Error("an idle keep-alive connection stayed open")
	}

	// Slow headers.
	c2, _ := net.Dial("tcp", addr)
	defer c2.Close()
	_, _ = io.WriteString(c2, "GET /readyz HTTP/1.1\r\nHost: x\r\n")
	if !closedWithin(c2, 10*short) {
		t.Error("a request whose headers never end stayed open")
	}

	// Slow body.
	c3, _ := net.Dial("tcp", addr)
	defer c3.Close()
	_, _ = io.WriteString(c3, "GET /readyz HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"+strings.Repeat("x", 10))
	if !closedWithin(c3, 10*short) {
		t.Error("a request whose body never ends stayed open")
	}
}

// The defaults are set (a zero Timeouts is not "no timeouts").
func TestServerDefaults(t *testing.T) {
	t.Parallel()
	s := httpapi.Server(http.NotFoundHandler(), httpapi.Timeouts{})
	if s.ReadHeaderTimeout <= 0 || s.ReadTimeout <= 0 || s.WriteTimeout <= 0 || s.IdleTimeout <= 0 {
		t.Fatalf("timeouts %s %s %s %s: want all set", s.ReadHeaderTimeout, s.ReadTimeout, s.WriteTimeout, s.IdleTimeout)
	}
}

// /debug/pprof/ exists only when asked for (http.pprof).
func TestPprofOnlyWhenEnabled(t *testing.T) {
	t.Parallel()
	for _, on := range []bool{false, true} {
		h := httpapi.Handler(httpapi.Deps{Pprof: on, Status: func(context.Context) (any, error) { return nil, nil }})
		for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap", "/debug/pprof/cmdline"} {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
			want := http.StatusNotFound
			if on {
				want = http.StatusOK
			}
			if rec.Code != want {
				t.Errorf("pprof=%t GET %s: %d, want %d", on, path, rec.Code, want)
			}
		}
	}
}
