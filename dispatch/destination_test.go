package dispatch_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/dispatch"
)

// Every rule of Template.Render, one row each: what a row may and may not
// make of a destination, per sink kind.
func TestRenderedDestinations(t *testing.T) {
	reserved := []string{"p:lock:", "p:fence:", "p:idempotency:"}
	for _, c := range []struct {
		name, tmpl, aggType, eventType string
		kind                           dispatch.NameKind
		prefix                         string
		want                           string // the name, or "!" + a fragment of the refusal
	}{
		{"nats default", "outbox.event.{aggregate_type}", "deal", "x", dispatch.NATSSubject, "", "outbox.event.deal"},
		{"nats dotted event type", "outbox.{event_type}", "deal", "deal.funded", dispatch.NATSSubject, "", "outbox.deal.funded"},
		{"nats JetStream API", "{aggregate_type}.{event_type}", "$JS.API.STREAM", "DELETE.orders", dispatch.NATSSubject, "", "!$JS"},
		{"nats $ token inside", "outbox.{aggregate_type}", "a.$SYS", "x", dispatch.NATSSubject, "", "!$SYS"},
		{"nats wildcard *", "outbox.{aggregate_type}", "*", "x", dispatch.NATSSubject, "", "!wildcard"},
		{"nats wildcard >", "outbox.{aggregate_type}", "a.>", "x", dispatch.NATSSubject, "", "!wildcard"},
		{"nats empty value", "outbox.{aggregate_type}", "", "x", dispatch.NATSSubject, "", "!empty token"},
		{"nats double dot", "outbox.{aggregate_type}", "a..b", "x", dispatch.NATSSubject, "", "!empty token"},
		{"nats control char", "outbox.{aggregate_type}", "a\x01", "x", dispatch.NATSSubject, "", "!control character"},
		{"kafka legal", "outbox.{aggregate_type}", "deal_1-x", "x", dispatch.KafkaTopic, "", "outbox.deal_1-x"},
		{"kafka illegal char", "outbox.{aggregate_type}", "deal/1", "x", dispatch.KafkaTopic, "", "!Kafka allows"},
		{"kafka too long", "o.{aggregate_type}", strings.Repeat("a", 248), "x", dispatch.KafkaTopic, "", "!249"},
		{"kafka dot", "{aggregate_type}", ".", "x", dispatch.KafkaTopic, "", "!not allowed by Kafka"},
		{"amqp 255", "k.{aggregate_type}", strings.Repeat("a", 253), "x", dispatch.AMQPRoutingKey, "", "k." + strings.Repeat("a", 253)},
		{"amqp 256", "k.{aggregate_type}", strings.Repeat("a", 254), "x", dispatch.AMQPRoutingKey, "", "!255"},
		{"amqp wildcards are literal", "k.{aggregate_type}", "#.*", "x", dispatch.AMQPRoutingKey, "", "k.#.*"},
		{"redis stream", "outbox.event.{aggregate_type}", "deal", "x", dispatch.RedisStreamKey, "p:", "p:outbox.event.deal"},
		{"redis lock key", "{aggregate_type}", "lock:reconciliation", "x", dispatch.RedisStreamKey, "p:", "!key space"},
		{"redis fence", "{aggregate_type}", "fence:{lock:outbox:poller}", "x", dispatch.RedisStreamKey, "p:", "!key space"},
		{"redis idempotency", "{aggregate_type}:{event_type}", "idempotency", "notify:1000", dispatch.RedisStreamKey, "p:", "!key space"},
		{"redis other prefix", "{aggregate_type}", "lock:x", "x", dispatch.RedisStreamKey, "q:", "q:lock:x"},
		{"pubsub legal", "t.{aggregate_type}", "deal-1_x.~+%", "x", dispatch.PubSubTopic, "", "t.deal-1_x.~+%"},
		{"pubsub 3", "{aggregate_type}", "abc", "x", dispatch.PubSubTopic, "", "abc"},
		{"pubsub 2", "{aggregate_type}", "ab", "x", dispatch.PubSubTopic, "", "!3 to 255"},
		{"pubsub 255", "t.{aggregate_type}", strings.Repeat("a", 253), "x", dispatch.PubSubTopic, "", "t." + strings.Repeat("a", 253)},
		{"pubsub 256", "t.{aggregate_type}", strings.Repeat("a", 254), "x", dispatch.PubSubTopic, "", "!3 to 255"},
		{"pubsub not a letter first", "{aggregate_type}", "1deal", "x", dispatch.PubSubTopic, "", "!start with a letter"},
		{"pubsub goog", "{aggregate_type}", "Google", "x", dispatch.PubSubTopic, "", "!goog"},
		{"pubsub illegal char", "t.{aggregate_type}", "deal/1", "x", dispatch.PubSubTopic, "", "!Pub/Sub allows"},
		{"kinesis legal", "s.{aggregate_type}", "deal-1_x", "x", dispatch.KinesisStream, "", "s.deal-1_x"},
		{"kinesis 128", "s.{aggregate_type}", strings.Repeat("a", 126), "x", dispatch.KinesisStream, "", "s." + strings.Repeat("a", 126)},
		{"kinesis 129", "s.{aggregate_type}", strings.Repeat("a", 127), "x", dispatch.KinesisStream, "", "!Kinesis allows 128"},
		{"kinesis illegal char", "s.{aggregate_type}", "deal~1", "x", dispatch.KinesisStream, "", "!Kinesis allows ASCII"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tm := mustTemplate(t, c.tmpl)
			ev := dispatch.Event{ID: 7, AggregateType: c.aggType, EventType: c.eventType}
			name, err := tm.Render(ev, dispatch.NameRules{Kind: c.kind, Prefix: c.prefix, Reserved: reserved})
			frag, refused := strings.CutPrefix(c.want, "!")
			switch {
			case !refused && (err != nil || name != c.want):
				t.Fatalf("got %q, %v; want %q", name, err, c.want)
			case refused && err == nil:
				t.Fatalf("got %q accepted; want refused (%s)", name, frag)
			case refused && (!strings.Contains(err.Error(), frag) || !dispatch.IsPermanent(err) || !errors.Is(err, dispatch.ErrDestination)):
				t.Fatalf("refusal %v: want a permanent ErrDestination mentioning %q", err, frag)
			}
		})
	}
}

func TestStartsWithPlaceholder(t *testing.T) {
	for tmpl, want := range map[string]bool{
		"{aggregate_type}.{event_type}": true, "{event_type}": true, "outbox.{aggregate_type}": false, "fixed": false,
	} {
		if got := mustTemplate(t, tmpl).StartsWithPlaceholder(); got != want {
			t.Errorf("%q: %v, want %v", tmpl, got, want)
		}
	}
}

func mustTemplate(t *testing.T, s string) dispatch.Template {
	t.Helper()
	tm, err := dispatch.ParseTemplate(s)
	if err != nil {
		t.Fatal(err)
	}
	return tm
}
