package webhook

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http/httptrace"
	"net/textproto"
	"sync/atomic"
	"time"

	"github.com/outboxd/outboxd/dispatch"
)

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
		return 0, dispatch.ErrDeadlinePassed
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

// sendGuard is one request's hold on its connection (armSend).
type sendGuard struct {
	wrote atomic.Bool // the request reached the socket
	stop  atomic.Pointer[func() bool]
}

// armSend arms the connection the request gets (HTTP/1: one request per
// connection at a time) with ctx's deadline, two ways:
//
//   - no write once the deadline has passed (deadlineConn);
//   - a hard deadline on the socket: when ctx ends (its deadline, or the
//     caller cancelling it) before release is called, every read and write
//     on the connection fails at once. This is what bounds a send whatever
//     the peer does, including the paths net/http leaves to the caller (the
//     raw connection of a 101 answer ignores the request's context).
//
// Interim answers other than 100 and 103 end the request with
// dispatch.ErrInterim (net/http reports them through the trace only). Call
// release once the response is done with: after it, ctx ending no longer
// touches the connection, which may be reused.
func armSend(ctx context.Context) (context.Context, *sendGuard) {
	var until int64
	if d, ok := ctx.Deadline(); ok {
		until = d.UnixNano()
	}
	g := &sendGuard{}
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			conn := info.Conn
			if tc, ok := conn.(*tls.Conn); ok {
				conn = tc.NetConn()
			}
			dc, ok := conn.(*deadlineConn)
			if !ok {
				return
			}
			dc.until.Store(until)
			stop := context.AfterFunc(ctx, func() {
				// A time in the past: blocked reads and writes return now.
				_ = dc.SetDeadline(time.Unix(1, 0))
			})
			if prev := g.stop.Swap(&stop); prev != nil {
				(*prev)() // the transport retried on a new connection
			}
		},
		WroteRequest: func(info httptrace.WroteRequestInfo) {
			if info.Err == nil {
				g.wrote.Store(true)
			}
		},
		Got1xxResponse: func(code int, _ textproto.MIMEHeader) error {
			if code == 100 || code == 103 {
				return nil
			}
			return fmt.Errorf("receiver answered %d: %w", code, dispatch.ErrInterim)
		},
	}), g
}

// release detaches the guard from the connection (see armSend).
func (g *sendGuard) release() {
	if stop := g.stop.Load(); stop != nil {
		(*stop)()
	}
}

// unanswered: the request was written and no final status came back.
func (g *sendGuard) unanswered() bool { return g.wrote.Load() }
