package rabbitmq

import (
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxd/outboxd/dispatch"
)

// frameOverhead is an AMQP frame's bytes around its payload: type (1),
// channel (2), payload size (4), frame-end (1).
const frameOverhead = 8

// headerFrameSize is the size of p's content header frame, as amqp091-go
// writes it (write.go, headerFrame.write) for the properties this sink
// sets: class, weight, body size and property flags (14 bytes), then each
// property present; headers are a table of long strings. Unlike the body,
// the header frame cannot be split across frames, so it must fit in the
// connection's negotiated frame_max. (RabbitMQ tolerates 8 bytes more, its
// FRAME_SIZE_FUDGE; the check keeps to the protocol's limit.)
func headerFrameSize(p amqp.Publishing) int {
	n := frameOverhead + 14
	short := func(s string) {
		if s != "" {
			n += 1 + len(s)
		}
	}
	short(p.ContentType)
	short(p.MessageId)
	short(p.Type)
	if len(p.Headers) > 0 {
		n += 4 // the table's byte length
		for k, v := range p.Headers {
			s, _ := v.(string) // the sink puts only strings in the table
			n += 1 + len(k) + 1 + 4 + len(s)
		}
	}
	if p.DeliveryMode > 0 {
		n++
	}
	if !p.Timestamp.IsZero() {
		n += 8
	}
	return n
}

// checkFrame refuses, before it is published, a message whose header frame
// is larger than the connection's frame_max: the broker would close the
// whole connection on it (FRAME_ERROR), cutting every other message in
// flight. It can never fit: Permanent, for this event only.
func checkFrame(ev dispatch.Event, p amqp.Publishing, frameMax int) error {
	if frameMax <= 0 { // 0: no limit negotiated
		return nil
	}
	if size := headerFrameSize(p); size > frameMax {
		return &dispatch.Error{Permanent: true, Err: fmt.Errorf(
			"rabbitmq: event %d: its headers (row headers, aggregate_id, event_type) make a header frame of %d bytes, above the connection's frame_max of %d bytes (the broker would close the connection): retrying cannot help; make the row's headers or ids smaller, or raise frame_max on the broker, then replay",
			ev.ID, size, frameMax)}
	}
	return nil
}
