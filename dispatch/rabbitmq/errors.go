package rabbitmq

import (
	"fmt"
	"regexp"
	"strconv"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxd/outboxd/dispatch"
)

// unroutable: the broker returned the message (mandatory, no queue bound
// for its routing key). It acks it afterwards; that ack is no delivery.
func (s *Sink) unroutable(ev dispatch.Event, r amqp.Return) error {
	return fmt.Errorf("rabbitmq: event %d unroutable: exchange %q has no queue bound for routing key %q (broker: %d %s): bind a queue to the exchange for this key; it will be sent again",
		ev.ID, r.Exchange, r.RoutingKey, r.ReplyCode, r.ReplyText)
}

// nacked: the broker refused the message (basic.nack).
func (s *Sink) nacked(ev dispatch.Event, rk string) error {
	return fmt.Errorf("rabbitmq: event %d: the broker refused it (basic.nack) on exchange %q routing key %q: a queue it routes to is full with x-overflow reject-publish, or unavailable; it will be sent again",
		ev.ID, s.exchange, rk)
}

// publishError: the library could not publish (the channel or connection
// is gone, or the write failed).
func (s *Sink) publishError(ev dispatch.Event, rk string, err error, reason *amqp.Error) error {
	if reason != nil {
		return fmt.Errorf("rabbitmq: event %d: not published to exchange %q routing key %q: the channel closed (%w); it will be sent again",
			ev.ID, s.exchange, rk, reason)
	}
	return fmt.Errorf("rabbitmq: event %d: publish to exchange %q routing key %q on %s: %w; it will be sent again", ev.ID, s.exchange, rk, s.target, err)
}

// closedError classifies an unconfirmed message whose channel closed: the
// broker closes a channel for a message it refuses for good (too large,
// access refused) and for things a retry mends (the exchange deleted, the
// connection lost).
func (s *Sink) closedError(ev dispatch.Event, rk string, reason *amqp.Error) error {
	if reason.Server {
		switch reason.Code {
		case amqp.PreconditionFailed:
			if max, ok := maxMessageSize(reason.Reason); ok {
				s.maxSize = max // later events above it are refused before publishing
				if len(ev.Payload) > max {
					return tooLarge(ev, max)
				}
			}
		case amqp.AccessRefused:
			// A topic permission refuses one routing key; an exchange
			// permission all. The closing cut the others short.
			if topic, ok := refusedTopic(reason.Reason); !ok || topic == rk {
				return &dispatch.Error{Permanent: true, Err: fmt.Errorf(
					"rabbitmq: event %d: the broker refused publishing to exchange %q with routing key %q (%s): grant the user write permission on the exchange (and topic permission for the key), then replay the dead-lettered events",
					ev.ID, s.exchange, rk, reason.Reason)}
			}
		case amqp.NotFound:
			return fmt.Errorf("rabbitmq: event %d: exchange %q not found on %s (%s): deleted while in use? It is declared again at the next send",
				ev.ID, s.exchange, s.target, reason.Reason)
		}
	}
	return fmt.Errorf("rabbitmq: event %d: the channel closed before the broker confirmed the message (%w); it will be sent again", ev.ID, reason)
}

// tooLarge: the payload exceeds the broker's max_message_size.
func tooLarge(ev dispatch.Event, max int) error {
	return &dispatch.Error{Permanent: true, Err: fmt.Errorf(
		"rabbitmq: event %d: payload of %d bytes is larger than the broker's max_message_size (%d bytes): raise it on the broker or keep events smaller, then replay",
		ev.ID, len(ev.Payload), max)}
}

// RabbitMQ's texts: "message size 200 is larger than configured max size
// 100" (rabbit_channel:check_msg_size), and "write access to topic 'k' in
// exchange 'x' in vhost '/' refused for user 'u'" (topic permissions).
var (
	maxSizeText = regexp.MustCompile(`larger than (?:configured )?max size (\d+)`)
	topicText   = regexp.MustCompile(`access to topic '([^']*)'`)
)

func maxMessageSize(reason string) (int, bool) {
	m := maxSizeText.FindStringSubmatch(reason)
	if m == nil {
		return 0, false
	}
	n, err := strconv.Atoi(m[1])
	return n, err == nil && n > 0
}

func refusedTopic(reason string) (string, bool) {
	m := topicText.FindStringSubmatch(reason)
	if m == nil {
		return "", false
	}
	return m[1], true
}
