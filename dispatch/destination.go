package dispatch

import (
	"errors"
	"fmt"
	"strings"
)

// NameKind says which broker's naming rules a rendered destination follows.
type NameKind uint8

const (
	NATSSubject    NameKind = iota + 1 // tokens separated by '.'
	KafkaTopic                         // [A-Za-z0-9._-], at most 249 bytes
	AMQPRoutingKey                     // an AMQP short string: at most 255 bytes
	RedisStreamKey                     // a Redis key, outside the relay's own key space
	PubSubTopic                        // a Pub/Sub topic ID: a letter, then [A-Za-z0-9-_.~+%], 3 to 255 bytes, not "goog..."
	KinesisStream                      // a Kinesis stream name: [A-Za-z0-9_.-], 1 to 128 bytes
)

func (k NameKind) String() string {
	return [...]string{"destination", "NATS subject", "Kafka topic", "AMQP routing key", "Redis stream key", "Pub/Sub topic", "Kinesis stream"}[k]
}

// NameRules check a destination rendered from a row before anything is sent
// to it. This is the one place those rules live; every broker sink renders
// its destination with Template.Render.
type NameRules struct {
	Kind NameKind
	// Prefix goes before the rendered name (a Redis stream key gets
	// redis.key_prefix); Reserved are prefixes no rendered name may start
	// with: the relay's own keys (lock:, fence:, idempotency: under the
	// prefix), given by the wiring: dispatch knows nothing of them.
	Prefix   string
	Reserved []string
}

// ErrDestination: a destination rendered from a row breaks its broker's
// naming rules, or reaches outside the template's structure.
var ErrDestination = errors.New("refused destination")

// Render expands t with ev's values and checks the result (Prefix
// included) against r. A refused name is a Permanent *Error naming the rule
// and the row's values: retrying the same row cannot help.
//
// Guarantees, per kind:
//   - every kind: no placeholder value holds a control character, and the
//     name is not empty;
//   - NATS subject: no empty token, no wildcard token ("*", ">"), no token
//     starting with '$' (the server's API and system subjects: $JS.API,
//     $SYS, $KV ...). A '.' inside a value adds tokens under the template's
//     literal prefix (event types such as "deal.funded" rely on it);
//     whitespace and length are the nats package's (what the client
//     protocol can carry);
//   - Kafka topic: Kafka's legal characters and length, not "." or "..";
//   - AMQP routing key: at most 255 bytes;
//   - Redis stream key: none of the Reserved prefixes;
//   - Pub/Sub topic ID and Kinesis stream name: their service's characters
//     and lengths (Pub/Sub: starts with a letter, not with "goog").
//
// Starting a template with a literal prefix (checked at load) is what keeps
// a row from choosing a destination outside the template's space.
func (t Template) Render(ev Event, r NameRules) (string, error) {
	name := r.Prefix + t.Expand(ev)
	if err := r.check(name, t.values(ev)); err != nil {
		return name, &Error{Permanent: true, Err: fmt.Errorf("event %d: %s %q (aggregate_type %q, event_type %q): %w: %w",
			ev.ID, r.Kind, Clip(name, 200), Clip(ev.AggregateType, 100), Clip(ev.EventType, 100), ErrDestination, err)}
	}
	return name, nil
}

// StartsWithPlaceholder reports whether the template's first part is a
// row value: the row, not the operator, would choose the destination's
// namespace.
func (t Template) StartsWithPlaceholder() bool { return len(t.parts) > 1 && t.parts[0] == "" }

// values are the placeholders' values for ev, in template order.
func (t Template) values(ev Event) []string {
	var vs []string
	for i := 1; i < len(t.parts); i += 2 {
		if t.parts[i] == "aggregate_type" {
			vs = append(vs, ev.AggregateType)
		} else {
			vs = append(vs, ev.EventType)
		}
	}
	return vs
}

// check applies the rules every kind shares, then the rules of r.Kind.
func (r NameRules) check(name string, values []string) error {
	if err := controlFree(values); err != nil {
		return err
	}
	if name == "" {
		return errors.New("the name is empty (is a placeholder's value empty?)")
	}
	if int(r.Kind) < len(kindRules) && kindRules[r.Kind] != nil {
		return kindRules[r.Kind](r, name)
	}
	return nil
}

// kindRules are each kind's own rules for a non-empty name, indexed by
// NameKind.
var kindRules = [...]func(NameRules, string) error{
	NATSSubject:    NameRules.natsSubject,
	KafkaTopic:     NameRules.kafkaTopic,
	AMQPRoutingKey: NameRules.amqpRoutingKey,
	RedisStreamKey: NameRules.redisStreamKey,
	PubSubTopic:    NameRules.pubSubTopic,
	KinesisStream:  NameRules.kinesisStream,
}

// controlFree refuses placeholder values holding a control character.
func controlFree(values []string) error {
	for _, v := range values {
		if !HeaderSafe(v) {
			return errors.New("a row value holds a control character")
		}
	}
	return nil
}

// natsSubject refuses empty tokens, wildcard tokens and tokens starting
// with '$' (the server's API and system subjects).
func (NameRules) natsSubject(name string) error {
	for tok := range strings.SplitSeq(name, ".") {
		switch {
		case tok == "":
			return errors.New("it has an empty token (a leading, trailing or double dot; is a placeholder's value empty?)")
		case tok == "*" || tok == ">":
			return fmt.Errorf("it has the wildcard token %q", tok)
		case tok[0] == '$':
			return fmt.Errorf("it has the token %q: subjects starting with $ are the server's API and system subjects", Clip(tok, 40))
		}
	}
	return nil
}

// kafkaTopic applies Kafka's legal characters and length, and refuses "."
// and "..".
func (NameRules) kafkaTopic(name string) error {
	if name == "." || name == ".." {
		return errors.New("the name is not allowed by Kafka")
	}
	if len(name) > 249 {
		return fmt.Errorf("it is %d bytes long; Kafka allows 249", len(name))
	}
	return charset(name, "._-", "Kafka allows ASCII letters, digits, '.', '_' and '-'")
}

// amqpRoutingKey applies the AMQP short string's length.
func (NameRules) amqpRoutingKey(name string) error {
	if len(name) > 255 {
		return fmt.Errorf("it is %d bytes long; AMQP allows 255", len(name))
	}
	return nil
}

// redisStreamKey refuses a key in the relay's own key space (r.Reserved).
func (r NameRules) redisStreamKey(name string) error {
	for _, p := range r.Reserved {
		if strings.HasPrefix(name, p) {
			return fmt.Errorf("it is in the relay's own key space (%s...)", p)
		}
	}
	return nil
}

// pubSubTopic applies Pub/Sub's topic ID rules:
// https://cloud.google.com/pubsub/docs/create-topic#resource_names
func (NameRules) pubSubTopic(name string) error {
	switch c := name[0]; {
	case !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'):
		return errors.New("it does not start with a letter, as Pub/Sub requires")
	case strings.HasPrefix(strings.ToLower(name), "goog"):
		return errors.New(`it starts with "goog", which Pub/Sub reserves`)
	case len(name) < 3 || len(name) > 255:
		return fmt.Errorf("it is %d bytes long; Pub/Sub allows 3 to 255", len(name))
	}
	return charset(name, "-_.~+%", "Pub/Sub allows ASCII letters, digits and - _ . ~ + %")
}

// kinesisStream applies Kinesis' stream name characters and length.
func (NameRules) kinesisStream(name string) error {
	if len(name) > 128 {
		return fmt.Errorf("it is %d bytes long; Kinesis allows 128", len(name))
	}
	return charset(name, "_.-", "Kinesis allows ASCII letters, digits, '_', '.' and '-'")
}

// charset checks that name holds only ASCII letters, digits and the bytes
// of extra; allowed says what is allowed, for the error.
func charset(name, extra, allowed string) error {
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte(extra, c) >= 0) {
			return fmt.Errorf("it has %q; %s", string(rune(c)), allowed)
		}
	}
	return nil
}
