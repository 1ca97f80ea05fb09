package webhook

import (
	"context"
	"errors"
	"net"
	"net/http/httptrace"
	"os"
	"testing"
	"time"
)

// The hard deadline: once the send's context ends, a read blocked on the
// connection returns, whoever holds it (net/http gives a 101's connection
// to the caller and stops watching the context). After release the context
// no longer touches the connection, so it can be reused.
func TestSendGuardUnblocksTheSocket(t *testing.T) {
	for _, released := range []bool{false, true} {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		ctx, cancel := context.WithCancel(context.Background())
		actx, g := armSend(ctx)
		httptrace.ContextClientTrace(actx).GotConn(httptrace.GotConnInfo{Conn: &deadlineConn{Conn: a}})
		if released {
			g.release()
		}
		cancel()
		if released {
			// A pipe checks its deadline before its data: the byte arrives
			// only if no deadline was set.
			go func() { _, _ = b.Write([]byte("x")) }()
		}
		// A backstop so a broken guard fails the test instead of hanging
		// it: a read ended by closing is not a deadline error.
		backstop := time.AfterFunc(10*time.Second, func() { _ = a.Close() })
		_, err := a.Read(make([]byte, 1))
		backstop.Stop()
		switch {
		case !released && !errors.Is(err, os.ErrDeadlineExceeded):
			t.Fatalf("context ended: read returned %v, want a deadline error", err)
		case released && err != nil:
			t.Fatalf("released guard: read returned %v, want the peer's byte", err)
		}
	}
}
