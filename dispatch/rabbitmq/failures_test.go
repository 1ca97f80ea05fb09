package rabbitmq

import (
	"context"
	"fmt"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxd/outboxd/dispatch"
)

const (
	D  = dispatch.Delivered
	R  = dispatch.Retryable
	P  = dispatch.Permanent
	NA = dispatch.NotAttempted
)

// TestUnroutableIsRetryable: with no queue bound, the broker returns the
// message and then acks it; that is a retryable failure naming the
// exchange and routing key, never a delivery. Binding a queue mends it.
func TestUnroutableIsRetryable(t *testing.T) {
	t.Parallel()
	a := newAdmin(t)
	a.declareExchange(amqp.ExchangeTopic)
	s := newSink(t, Config{Exchange: a.exchange})

	events := []dispatch.Event{ev(1, "deal", "1", "x"), ev(2, "deal", "2", "x"), ev(3, "deal", "1", "x")}
	res := send(t, s, events...)
	wantOutcomes(t, res, R, R, NA)
	for _, r := range res[:2] {
		msg := fmt.Sprint(r.Err)
		if r.Cut || !strings.Contains(msg, a.exchange) || !strings.Contains(msg, `"outbox.event.deal"`) || !strings.Contains(msg, "bind a queue") {
			t.Errorf("error %q (cut %v): want the exchange, the routing key and what to do", msg, r.Cut)
		}
	}

	q := a.queue("outbox.event.*", nil)
	allDelivered(t, send(t, s, events...))
	if n := len(a.drain(q)); n != 3 {
		t.Errorf("queue holds %d messages, want 3", n)
	}
}

// TestReturnsSeenBeforeConfirms: in one large batch where only some
// messages are unroutable (their own routing keys), exactly those fail and
// exactly the others are delivered, every time. RabbitMQ sends the
// basic.return before the basic.ack of a message; the sink must take the
// return into account before it counts the ack. Two chunks per batch, so
// the returns buffer is reused across chunks.
func TestReturnsSeenBeforeConfirms(t *testing.T) {
	t.Parallel()
	a := newAdmin(t)
	a.declareExchange(amqp.ExchangeTopic)
	q := a.queue("routed.#", nil)
	s := newSink(t, Config{Exchange: a.exchange, RoutingKey: "{event_type}"})

	const n = 2*chunk + 100
	routed := 0
	for round := range 6 {
		events := make([]dispatch.Event, n)
		lost := make([]bool, n)
		for i := range events {
			id := int64(round*n + i + 1)
			typ := "routed.x"
			// An irregular pattern: runs of both kinds, of several lengths.
			if lost[i] = (i*7+round)%11 < 4; lost[i] {
				typ = "lost.x"
			}
			events[i] = ev(id, "deal", fmt.Sprint(id), typ) // one aggregate each: no prefix rule
		}
		res := send(t, s, events...)
		for i, r := range res {
			switch {
			case lost[i] && (r.Outcome != R || !strings.Contains(fmt.Sprint(r.Err), "unroutable")):
				t.Fatalf("round %d: unroutable event #%d: %v (%v), want retryable unroutable", round, i, r.Outcome, r.Err)
			case !lost[i] && r.Outcome != D:
				t.Fatalf("round %d: routed event #%d: %v (%v), want delivered", round, i, r.Outcome, r.Err)
			case !lost[i]:
				routed++
			}
		}
	}
	if got := a.count(q); got != routed {
		t.Errorf("queue holds %d messages, want the %d delivered", got, routed)
	}
}

// TestReturnTakenWhenBothArrived: the hardest case for the ordering, made
// certain: every confirm has arrived before the sink looks at any, so each
// unroutable message's return and ack are both waiting. The sink must
// still see every return first.
func TestReturnTakenWhenBothArrived(t *testing.T) {
	t.Parallel()
	a := newAdmin(t)
	a.declareExchange(amqp.ExchangeTopic)
	a.queue("routed.#", nil)
	s := newSink(t, Config{Exchange: a.exchange, RoutingKey: "{event_type}"})

	events := make([]dispatch.Event, chunk)
	for i := range events {
		typ := "routed.x"
		if i%2 == 0 {
			typ = "lost.x"
		}
		events[i] = ev(int64(i+1), "deal", fmt.Sprint(i), typ)
	}
	b := batchOf(events...)
	ctx := context.Background()
	l, err := s.ready(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rounds := dispatch.NewRounds(events)
	tr := &sending{s: s, l: l, ctx: ctx, until: b.Until(), b: b, r: rounds, returned: map[string]amqp.Return{}}
	fl, _ := tr.publish(0, len(events))
	for _, f := range fl {
		<-f.dc.Done()
	}
	tr.confirm(fl)
	for i, r := range rounds.Results() {
		if want := []dispatch.Outcome{R, D}[i%2]; r.Outcome != want {
			t.Fatalf("event #%d: %v (%v), want %v", i, r.Outcome, r.Err, want)
		}
	}
}

// TestPrefixRule: after an aggregate's first failure its later events are
// NotAttempted, even one the broker took; other aggregates are unaffected.
func TestPrefixRule(t *testing.T) {
	t.Parallel()
	a := newAdmin(t)
	a.declareExchange(amqp.ExchangeTopic)
	q := a.queue("routed.#", nil)
	s := newSink(t, Config{Exchange: a.exchange, RoutingKey: "{event_type}"})

	res := send(t, s,
		ev(1, "deal", "A", "routed.1"), ev(2, "deal", "B", "routed.1"),
		ev(3, "deal", "A", "lost.2"), ev(4, "deal", "B", "routed.2"),
		ev(5, "deal", "A", "routed.3"), ev(6, "deal", "B", "routed.3"))
	wantOutcomes(t, res, D, D, R, D, NA, D)
	// The broker holds A's third event although it is reported not
	// attempted: it is sent again after the second (consumers dedupe).
	ids := map[string]bool{}
	for _, d := range a.drain(q) {
		ids[d.MessageId] = true
	}
	if len(ids) != 5 || !ids["5"] || ids["3"] {
		t.Errorf("queue holds messages %v, want every one but 3", ids)
	}
}

// TestNackIsRetryable: a queue full with x-overflow reject-publish makes
// the broker nack; the nacked event is retryable, its aggregate's later
// events not attempted, another aggregate on another queue delivered.
func TestNackIsRetryable(t *testing.T) {
	t.Parallel()
	a := newAdmin(t)
	a.declareExchange(amqp.ExchangeTopic)
	full := a.queue("full", amqp.Table{"x-max-length": int32(2), "x-overflow": "reject-publish"})
	a.queue("ok", nil)
	s := newSink(t, Config{Exchange: a.exchange, RoutingKey: "{aggregate_type}"})

	res := send(t, s,
		ev(1, "full", "1", "x"), ev(2, "ok", "1", "x"), ev(3, "full", "1", "x"), ev(4, "ok", "1", "x"),
		ev(5, "full", "1", "x"), ev(6, "ok", "1", "x"), ev(7, "full", "1", "x"))
	wantOutcomes(t, res, D, D, D, D, R, D, NA)
	if msg := fmt.Sprint(res[4].Err); res[4].Cut || !strings.Contains(msg, "basic.nack") || !strings.Contains(msg, `"full"`) {
		t.Errorf("nack error %q (cut %v): want it named, with the routing key", msg, res[4].Cut)
	}
	if n := a.count(full); n != 2 {
		t.Errorf("full queue holds %d, want 2", n)
	}
}

// TestExchangeOfAnotherType: an exchange that exists with another type is
// a configuration error: permanent, with a message saying what to do,
// logged once however many batches hit it. Fixing it mends the same sink.
func TestExchangeOfAnotherType(t *testing.T) {
	t.Parallel()
	a := newAdmin(t)
	a.declareExchange(amqp.ExchangeDirect)
	var lg logs
	s := newSink(t, Config{Exchange: a.exchange, Log: lg.logger()})

	for range 3 {
		res := send(t, s, ev(1, "deal", "1", "x"), ev(2, "deal", "2", "x"), ev(3, "deal", "1", "x"))
		wantOutcomes(t, res, P, P, NA)
		msg := fmt.Sprint(res[0].Err)
		if !strings.Contains(msg, "not a durable topic exchange") || !strings.Contains(msg, a.exchange) || !strings.Contains(msg, "dispatch.rabbitmq.exchange") {
			t.Errorf("error %q: want the exchange, what is wrong and the key to change", msg)
		}
	}
	if errs := lg.records("ERROR"); len(errs) != 1 {
		t.Errorf("%d ERROR lines, want 1; logs:\n%s", len(errs), lg.String())
	}

	a.deleteExchange()
	a.declareExchange(amqp.ExchangeTopic)
	q := a.queue("#", nil)
	allDelivered(t, send(t, s, ev(4, "deal", "1", "x")))
	if n := a.count(q); n != 1 {
		t.Errorf("queue holds %d, want 1", n)
	}
}

// TestExchangeDeletedInUse: publishing to an exchange deleted since the
// channel declared it closes the channel (404): retryable; the next send
// declares it again on a new channel.
func TestExchangeDeletedInUse(t *testing.T) {
	t.Parallel()
	a := newAdmin(t)
	a.declareExchange(amqp.ExchangeTopic)
	a.queue("#", nil)
	s := newSink(t, Config{Exchange: a.exchange})
	allDelivered(t, send(t, s, ev(1, "deal", "1", "x")))

	a.deleteExchange()
	res := send(t, s, ev(2, "deal", "1", "x"), ev(3, "deal", "2", "x"), ev(4, "deal", "1", "x"))
	wantOutcomes(t, res, R, R, NA)
	if msg := fmt.Sprint(res[0].Err); res[0].Cut || !strings.Contains(msg, "not found") {
		t.Errorf("error %q (cut %v): want exchange not found", msg, res[0].Cut)
	}

	a.declareExchange(amqp.ExchangeTopic)
	q := a.queue("#", nil) // the old binding went with the exchange
	allDelivered(t, send(t, s, ev(2, "deal", "1", "x"), ev(3, "deal", "2", "x"), ev(4, "deal", "1", "x")))
	if n := a.count(q); n != 3 {
		t.Errorf("queue holds %d, want 3", n)
	}
}

// TestRoutingKeyTooLong: a routing key AMQP cannot carry (from a long
// aggregate_type) is permanent for that event only.
func TestRoutingKeyTooLong(t *testing.T) {
	t.Parallel()
	a := newAdmin(t)
	a.declareExchange(amqp.ExchangeTopic)
	q := a.queue("#", nil)
	s := newSink(t, Config{Exchange: a.exchange})
	long := strings.Repeat("a", 300)
	res := send(t, s, ev(1, long, "1", "x"), ev(2, "deal", "1", "x"), ev(3, long, "1", "x"))
	wantOutcomes(t, res, P, D, NA)
	if msg := fmt.Sprint(res[0].Err); !strings.Contains(msg, "routing key") || !strings.Contains(msg, "255") {
		t.Errorf("error %q: want the routing key and the limit", msg)
	}
	if n := a.count(q); n != 1 {
		t.Errorf("queue holds %d, want 1", n)
	}
}

// TestClassifyBrokerTexts: the broker texts the sink reads to tell a
// refusal for good from one a retry mends (the too-large case is not
// reproduced against the shared broker: its max_message_size is 128 MiB).
func TestClassifyBrokerTexts(t *testing.T) {
	t.Parallel()
	s := &Sink{exchange: "outbox", target: "amqp://h:5672/"}
	big := ev(1, "deal", "1", "x")
	big.Payload = make([]byte, 200)
	small := ev(2, "deal", "1", "x")
	tooBig := &amqp.Error{Code: amqp.PreconditionFailed, Server: true, Reason: "PRECONDITION_FAILED - message size 200 is larger than configured max size 100"}
	if err := s.closedError(big, "k", tooBig); !dispatch.IsPermanent(err) || !strings.Contains(err.Error(), "max_message_size (100 bytes)") {
		t.Errorf("too large: %v", err)
	}
	if err := s.closedError(small, "k", tooBig); dispatch.IsPermanent(err) {
		t.Errorf("a small message cut short by another's refusal: %v, want retryable", err)
	}
	if s.maxSize != 100 {
		t.Errorf("max size learned: %d", s.maxSize)
	}
	if err := s.check(big); !dispatch.IsPermanent(err) {
		t.Errorf("a message above the learned size is refused before publishing: %v", err)
	}
	topic := &amqp.Error{Code: amqp.AccessRefused, Server: true, Reason: "ACCESS_REFUSED - write access to topic 'a.b' in exchange 'outbox' in vhost '/' refused for user 'u'"}
	if err := s.closedError(small, "a.b", topic); !dispatch.IsPermanent(err) {
		t.Errorf("refused topic: %v, want permanent", err)
	}
	if err := s.closedError(small, "a.c", topic); dispatch.IsPermanent(err) {
		t.Errorf("another topic cut short: %v, want retryable", err)
	}
	forced := &amqp.Error{Code: amqp.ConnectionForced, Server: true, Reason: "CONNECTION_FORCED - broker forced connection closure"}
	if err := s.closedError(small, "k", forced); dispatch.IsPermanent(err) {
		t.Errorf("connection forced: %v, want retryable", err)
	}
}
