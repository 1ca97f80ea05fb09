package dispatch

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http/httptrace"
	"sync/atomic"
	"time"
)

// ErrDeadlinePassed: a request was not written because its context's
// deadline (for outboxd, the lock's trust deadline) had passed when the
// bytes were about to reach the socket.
var ErrDeadlinePassed = errors.New("dispatch: deadline passed before the request was written")

// deadlineConn refuses a Write once the current request's deadline has
// passed. The check sits right before the write syscall: a sender frozen
// (GC, SIGSTOP) after deciding to send but before writing cannot put an
// expired holder's request on the wire when it resumes. Once write returns
// the bytes are the kernel's and leave even if the process is frozen.
type deadlineConn struct {
	net.Conn
	until atomic.Int64 // unix nanoseconds; 0 = none
}

func (c *deadlineConn) Write(p []byte) (int, error) {
	if u := c.until.Load(); u != 0 && time.Now().UnixNano() >= u {
		return 0, ErrDeadlinePassed
	}
	return c.Conn.Write(p)
}

// dialDeadlineConns wraps every connection the transport dials.
func dialDeadlineConns(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &deadlineConn{Conn: c}, nil
	}
}

// withWriteDeadline arms the connection the request gets with ctx's
// deadline (HTTP/1: one request per connection at a time).
func withWriteDeadline(ctx context.Context) context.Context {
	var until int64
	if d, ok := ctx.Deadline(); ok {
		until = d.UnixNano()
	}
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			conn := info.Conn
			if tc, ok := conn.(*tls.Conn); ok {
				conn = tc.NetConn()
			}
			if dc, ok := conn.(*deadlineConn); ok {
				dc.until.Store(until)
			}
		},
	})
}
