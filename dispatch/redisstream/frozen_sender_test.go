package redisstream_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/dispatch/redisstream"
	"github.com/outboxd/outboxd/internal/testenv"
)

// freezingConn, once armed, stalls the next SetWriteDeadline until the
// wall clock is past until: a sender frozen (GC, SIGSTOP) after every check
// of its own, as go-redis arms the connection for the batch's write.
//
// It freezes before the deadline is set, not between setting it and the
// write: the Go runtime marks a deadline expired from a timer, and a
// process resuming from a freeze can write before that timer has run (a
// frozen Write let the entry through once, under -race on a heavily loaded
// machine).
// That window is documented (docs/sinks/redis_stream.md); what this test
// pins down is that the deadline go-redis gives the connection is the
// batch's trust deadline.
type freezingConn struct {
	net.Conn
	armed *atomic.Bool
	until *time.Time // read once armed
	froze *atomic.Bool
}

func (c *freezingConn) SetWriteDeadline(t time.Time) error {
	if c.armed.CompareAndSwap(true, false) {
		for d := time.Until(*c.until); d >= 0; d = time.Until(*c.until) {
			time.Sleep(d + time.Millisecond)
		}
		c.froze.Store(true)
	}
	return c.Conn.SetWriteDeadline(t)
}

// TestFrozenSenderWritesNothingPastTheDeadline: the batch's pipeline is
// frozen after the sink's last check until the trust deadline has passed;
// when it resumes, the connection's write deadline (the batch's trust
// deadline, set by go-redis from the context) refuses the write: the stream
// is never created and nothing is Delivered.
func TestFrozenSenderWritesNothingPastTheDeadline(t *testing.T) {
	t.Parallel()
	admin, prefix := testenv.Redis(t)
	var until time.Time // set before arming
	var armed, froze atomic.Bool
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(), ContextTimeoutEnabled: true, PoolSize: 1,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &freezingConn{Conn: conn, armed: &armed, until: &until, froze: &froze}, nil
		}})
	t.Cleanup(func() { _ = c.Close() })
	s := newSink(t, c, redisstream.Config{Stream: "frozen.{aggregate_type}", KeyPrefix: prefix}, nil)
	// Warm the connection (and the server version read), so the freeze
	// falls on the batch's own write.
	wantOutcomes(t, s.Send(context.Background(), batch(event(1, "warm", "1"))), dispatch.Delivered)

	until = time.Now().Add(200 * time.Millisecond)
	armed.Store(true)
	b := batch(event(2, "deal", "1"), event(3, "deal", "2"))
	b.Until = func() time.Time { return until }
	rs := s.Send(context.Background(), b)
	if !froze.Load() {
		t.Fatalf("the sender never reached the freeze point: %s", outcomes(rs))
	}
	for i, r := range rs {
		if r.Outcome == dispatch.Delivered {
			t.Errorf("event #%d delivered (%s) by a sender past its deadline", i, r.Ref)
		}
	}
	if n, err := admin.Exists(context.Background(), prefix+"frozen.deal").Result(); err != nil || n != 0 {
		t.Fatalf("the stream exists (%d, err %v): a sender past its deadline wrote to it", n, err)
	}
}
