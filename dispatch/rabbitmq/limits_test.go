package rabbitmq

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxd/outboxd/dispatch"
)

// headerFrameSize is checked against the broker itself. RabbitMQ takes a
// frame up to frame_max plus its 8-byte FRAME_SIZE_FUDGE and closes the
// connection (FRAME_ERROR) on one byte more: a formula that is off by a
// byte either way fails one of the two. checkFrame keeps to the protocol's
// frame_max, 8 bytes short of that.
func TestHeaderFrameSizeMatchesTheBroker(t *testing.T) {
	a := newAdmin(t)
	a.declareExchange("topic")
	q := a.queue("#", nil)
	const fudge = 8
	for _, extra := range []int{fudge, fudge + 1} {
		conn, err := amqp.Dial(brokerURL)
		if err != nil {
			t.Fatal(err)
		}
		closed := conn.NotifyClose(make(chan *amqp.Error, 1))
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if err := ch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		p := amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, MessageId: "1",
			Timestamp: time.Now(), Type: "t", Headers: amqp.Table{"id": "1", "big": ""}, Body: []byte(`{}`)}
		frameMax := conn.Config.FrameSize
		p.Headers["big"] = strings.Repeat("x", frameMax-headerFrameSize(p)+extra)
		if got := headerFrameSize(p); got != frameMax+extra {
			t.Fatalf("size %d, want %d", got, frameMax+extra)
		}
		if fit := p.Headers["big"].(string)[extra:]; checkFrame(dispatch.Event{}, amqp.Publishing{ContentType: p.ContentType,
			DeliveryMode: p.DeliveryMode, MessageId: p.MessageId, Timestamp: p.Timestamp, Type: p.Type,
			Headers: amqp.Table{"id": "1", "big": fit}}, frameMax) != nil {
			t.Fatal("checkFrame refused a header frame of exactly frame_max")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, a.exchange, "k", false, false, p)
		acked := false
		switch {
		case err == nil:
			acked, _ = dc.WaitContext(ctx)
		case extra == fudge:
			t.Fatal(err)
		default:
			// Over the limit the broker may close the connection while the
			// client is still writing the message's frames: the publish
			// itself fails; the close reason is checked below.
			var amqpErr *amqp.Error
			if !errors.As(err, &amqpErr) || amqpErr.Code != amqp.ChannelError {
				t.Fatalf("publishing a header frame of frame_max+9: %v, want the connection closed", err)
			}
		}
		cancel()
		if extra == fudge && checkFrame(dispatch.Event{}, p, frameMax) == nil {
			t.Fatalf("checkFrame let a header frame of frame_max+%d through", extra)
		}
		switch extra {
		case fudge:
			if !acked {
				t.Fatalf("a header frame of frame_max+8 (%d) was not confirmed: the formula overcounts", frameMax+extra)
			}
		default:
			if acked {
				t.Fatalf("a header frame of frame_max+9 (%d) was confirmed: the formula undercounts", frameMax+extra)
			}
			if reason := <-closed; reason == nil || reason.Code != amqp.FrameError {
				t.Fatalf("connection closed with %v, want FRAME_ERROR", reason)
			}
		}
		_ = conn.Close()
	}
	if n := a.count(q); n != 1 {
		t.Fatalf("queue holds %d messages, want the one that fit", n)
	}
}

// One event whose headers can never fit a frame is Permanent before it is
// published; the batch's other events go out once each on the same
// connection.
func TestHeaderFrameAboveFrameMaxIsPermanentForItsEventOnly(t *testing.T) {
	a := newAdmin(t)
	a.declareExchange("topic")
	q := a.queue("#", nil)
	s := newSink(t, Config{Exchange: a.exchange})
	big := ev(2, "order", "2", "order.created")
	big.Headers = json.RawMessage(`{"big":"` + strings.Repeat("x", 200<<10) + `"}`)
	longID := ev(3, "order", strings.Repeat("k", 150<<10), "order.created")
	res := send(t, s, ev(1, "order", "1", "order.created"), big, longID, ev(4, "order", "4", "order.created"))
	wantOutcomes(t, res, dispatch.Delivered, dispatch.Permanent, dispatch.Permanent, dispatch.Delivered)
	for _, i := range []int{1, 2} {
		if !strings.Contains(res[i].Err.Error(), "frame_max") {
			t.Errorf("event #%d: %v, want an error naming frame_max", i, res[i].Err)
		}
	}
	if s.link == nil || !s.link.usable() {
		t.Fatal("the connection did not survive the oversized events")
	}
	a.waitCount(q, 2)
	for _, d := range a.drain(q) {
		if d.MessageId != "1" && d.MessageId != "4" {
			t.Errorf("unexpected message %s in the queue", d.MessageId)
		}
	}
	var de *dispatch.Error
	if !errors.As(res[1].Err, &de) || !de.Permanent {
		t.Fatalf("want a permanent dispatch.Error, got %v", res[1].Err)
	}
}
