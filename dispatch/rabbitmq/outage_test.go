package rabbitmq

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxd/outboxd/dispatch"
)

// TestDeadlinePassed: a batch whose trust deadline has passed publishes
// nothing: every event NotAttempted, the queue empty.
func TestDeadlinePassed(t *testing.T) {
	t.Parallel()
	a := newAdmin(t)
	a.declareExchange(amqp.ExchangeTopic)
	q := a.queue("#", nil)
	s := newSink(t, Config{Exchange: a.exchange})

	past := time.Now().Add(-time.Second)
	res := s.Send(context.Background(), dispatch.Batch{Events: []dispatch.Event{ev(1, "deal", "1", "x"), ev(2, "deal", "2", "x")},
		Until: func() time.Time { return past }})
	wantOutcomes(t, res, NA, NA)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res = s.Send(ctx, batchOf(ev(1, "deal", "1", "x")))
	wantOutcomes(t, res, NA)
	if n := a.count(q); n != 0 {
		t.Errorf("queue holds %d, want nothing published", n)
	}
}

// TestDeadlinePassesMidSend: once the deadline has passed no further
// event is published; those sent before it are confirmed and delivered.
// The sink's clock jumps past the deadline after five publishes.
func TestDeadlinePassesMidSend(t *testing.T) {
	t.Parallel()
	a := newAdmin(t)
	a.declareExchange(amqp.ExchangeTopic)
	q := a.queue("#", nil)
	s := newSink(t, Config{Exchange: a.exchange})

	b := batchOf()
	for i := range 20 {
		b.Events = append(b.Events, ev(int64(i+1), "deal", strconv.Itoa(i), "x"))
	}
	until := b.Until()
	calls := 0
	s.now = func() time.Time {
		calls++
		if calls > 6 { // one look before connecting, then one per publish
			return until
		}
		return time.Now()
	}
	res := s.Send(context.Background(), b)
	for i, r := range res {
		want := dispatch.Delivered
		if i >= 5 {
			want = dispatch.NotAttempted
		}
		if r.Outcome != want {
			t.Errorf("event #%d: %v (%v), want %v", i, r.Outcome, r.Err, want)
		}
	}
	if n := a.count(q); n != 5 {
		t.Errorf("queue holds %d, want the 5 published before the deadline", n)
	}
}

// TestCutWaitingForConfirms: confirms that do not come back before the
// deadline leave their events Retryable and Cut, none delivered; the cut
// connection is dropped and the next send goes through on a new one.
func TestCutWaitingForConfirms(t *testing.T) {
	t.Parallel()
	a := newAdmin(t)
	a.declareExchange(amqp.ExchangeTopic)
	q := a.queue("#", nil)
	p := proxy(t, "127.0.0.1:0")
	s := newSink(t, Config{URL: urlVia(t, p.Listen), Exchange: a.exchange})
	allDelivered(t, send(t, s, ev(1, "deal", "1", "x"))) // connected
	a.drain(q)

	slow := toxic(t, p, "slow", "latency", "downstream", `{"latency":3000}`)
	events := []dispatch.Event{ev(2, "deal", "1", "x"), ev(3, "deal", "2", "x"), ev(4, "deal", "1", "x")}
	until := time.Now().Add(300 * time.Millisecond)
	res := s.Send(context.Background(), dispatch.Batch{Events: events, Token: 7, Until: func() time.Time { return until }})
	if time.Since(until) > 2*time.Second {
		t.Errorf("Send returned %v after its deadline", time.Since(until))
	}
	wantOutcomes(t, res, R, R, NA)
	for _, r := range res[:2] {
		if !r.Cut || !strings.Contains(fmt.Sprint(r.Err), "deadline") {
			t.Errorf("cut %v error %v: want Cut by the deadline", r.Cut, r.Err)
		}
	}

	slow()
	allDelivered(t, send(t, s, events...))
}

// TestChannelClosedMidBatch: the connection drops while confirms are
// outstanding: those events are Retryable (not cut: the broker went away),
// and the same sink reconnects at the next send.
func TestChannelClosedMidBatch(t *testing.T) {
	t.Parallel()
	a := newAdmin(t)
	a.declareExchange(amqp.ExchangeTopic)
	q := a.queue("#", nil)
	p := proxy(t, "127.0.0.1:0")
	var lg logs
	s := newSink(t, Config{URL: urlVia(t, p.Listen), Exchange: a.exchange, Log: lg.logger()})
	allDelivered(t, send(t, s, ev(1, "deal", "1", "x")))
	a.drain(q)

	held := toxic(t, p, "held", "latency", "downstream", `{"latency":20000}`) // confirms held back
	events := []dispatch.Event{ev(2, "deal", "1", "x"), ev(3, "deal", "2", "x"), ev(4, "deal", "3", "x")}
	var res []dispatch.Result
	var wg sync.WaitGroup
	wg.Go(func() { res = send(t, s, events...) })
	a.waitCount(q, 3) // published and enqueued; the acks are in the proxy
	p.Stop()
	wg.Wait()
	held()
	for i, r := range res {
		if r.Outcome != R || r.Cut || !strings.Contains(fmt.Sprint(r.Err), "channel closed") {
			t.Errorf("event #%d: %v cut %v (%v), want retryable, not cut, channel closed", i, r.Outcome, r.Cut, r.Err)
		}
	}

	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	allDelivered(t, send(t, s, events...))
	if !strings.Contains(lg.String(), "rabbitmq connection lost; reconnecting") {
		t.Errorf("no reconnection logged:\n%s", lg.String())
	}
}

// TestBrokerUnreachable: New succeeds with nothing listening; sends are
// Retryable (not cut) with an error naming the broker without its
// password; when the broker appears, the same sink delivers. It then goes
// away and comes back again.
func TestBrokerUnreachable(t *testing.T) {
	t.Parallel()
	a := newAdmin(t)
	a.declareExchange(amqp.ExchangeTopic)
	q := a.queue("#", nil)
	addr := freeAddr(t)
	s := newSink(t, Config{URL: urlVia(t, addr), Exchange: a.exchange})

	events := []dispatch.Event{ev(1, "deal", "1", "x"), ev(2, "deal", "2", "x"), ev(3, "deal", "1", "x")}
	res := send(t, s, events...)
	wantOutcomes(t, res, R, R, NA)
	for _, r := range res[:2] {
		msg := fmt.Sprint(r.Err)
		if r.Cut || !strings.Contains(msg, "connect to amqp://"+addr+"/") || strings.Contains(msg, "guest:") {
			t.Errorf("error %q (cut %v): want the broker named, not cut, no credentials", msg, r.Cut)
		}
	}

	p := proxy(t, addr)
	allDelivered(t, send(t, s, events...))

	p.Stop()
	// The sink may not have noticed yet: then the first publish fails on
	// the dead connection and the other aggregate's event is not attempted
	// (it never left); otherwise connecting fails for both aggregates.
	// Either way nothing is delivered and deal/1's second event waits.
	res = send(t, s, events...)
	if res[0].Outcome != R || (res[1].Outcome != R && res[1].Outcome != NA) || res[2].Outcome != NA {
		t.Errorf("proxy stopped: %v %v %v, want retryable, retryable or not attempted, not attempted",
			res[0].Outcome, res[1].Outcome, res[2].Outcome)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	allDelivered(t, send(t, s, events...))
	if n := a.count(q); n != 6 {
		t.Errorf("queue holds %d, want 6", n)
	}
}

// TestClose: Close is safe before any connection, after a failed one and
// twice; a send after Close is retryable.
func TestClose(t *testing.T) {
	t.Parallel()
	s := newSink(t, Config{URL: urlVia(t, freeAddr(t))})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = newSink(t, Config{URL: urlVia(t, freeAddr(t))})
	wantOutcomes(t, send(t, s, ev(1, "deal", "1", "x")), R)
	_ = s.Close()
	_ = s.Close()
	res := send(t, s, ev(1, "deal", "1", "x"))
	if res[0].Outcome != R || !strings.Contains(fmt.Sprint(res[0].Err), "closed") {
		t.Errorf("send after close: %v %v", res[0].Outcome, res[0].Err)
	}
}

// freeAddr is a loopback address nothing listens on (until a test does).
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
