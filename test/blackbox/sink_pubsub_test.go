package blackbox

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
)

// Black-box tests of dispatch.sink=pubsub: the built binary publishes over
// gRPC to pstest, the client library's Pub/Sub emulator, run inside this
// test process on a loopback port (dispatch.pubsub.endpoint
// http://host:port); the test reads the emulator's messages back.

const pubsubProject = "outboxd-blackbox"

// pubsubServer starts pstest with topics, closed at cleanup, after the
// replicas started later have stopped.
func pubsubServer(t *testing.T, topics ...string) *pstest.Server {
	t.Helper()
	srv := pstest.NewServerWithAddress("127.0.0.1:0")
	t.Cleanup(func() { _ = srv.Close() })
	for _, tp := range topics {
		createPubSubTopic(t, srv, tp)
	}
	return srv
}

func createPubSubTopic(t *testing.T, srv *pstest.Server, id string) {
	t.Helper()
	if _, err := srv.GServer.CreateTopic(context.Background(), &pubsubpb.Topic{Name: "projects/" + pubsubProject + "/topics/" + id}); err != nil {
		t.Fatalf("create topic %s: %v", id, err)
	}
}

// pubsubEnv is a testBundle whose replica publishes to srv with the default
// topic template (outbox.event.{aggregate_type}).
func pubsubEnv(t *testing.T, srv *pstest.Server) *testBundle {
	e := setup(t)
	e.set("OUTBOXD_DISPATCH_SINK", "pubsub",
		"OUTBOXD_DISPATCH_PUBSUB_PROJECT", pubsubProject,
		"OUTBOXD_DISPATCH_PUBSUB_ENDPOINT", "http://"+srv.Addr,
		"OUTBOXD_POLLER_LOCK_TTL", "10s")
	return e
}

// pubsubMessages are the messages srv holds for topic id, in publish order.
func pubsubMessages(srv *pstest.Server, id string) []*pstest.Message {
	var out []*pstest.Message
	for _, m := range srv.Messages() {
		if m.Topic == "projects/"+pubsubProject+"/topics/"+id {
			out = append(out, m)
		}
	}
	num := func(m *pstest.Message) int { n, _ := strconv.Atoi(strings.TrimPrefix(m.ID, "m")); return n }
	slices.SortFunc(out, func(a, b *pstest.Message) int { return num(a) - num(b) })
	return out
}

// pubsubDelivered turns messages into what checkContract reads: the
// attributes as headers, aggregate_id as the key (the ordering key is
// checked apart), the data as the body.
func pubsubDelivered(msgs []*pstest.Message) []delivered {
	out := make([]delivered, len(msgs))
	for i, m := range msgs {
		out[i] = delivered{where: "message " + m.ID, headers: m.Attributes, key: m.Attributes["aggregate_id"], body: string(m.Data)}
	}
	return out
}

// pubsubCase: the default topic template, CloudEvents on (ce-), and each
// message's ordering key its aggregate.
func pubsubCase() sinkCase {
	return sinkCase{
		name: "pubsub", cePrefix: "ce-",
		setup: func(t *testing.T) (*testBundle, func(int) []delivered) {
			srv := pubsubServer(t, "outbox.event.order")
			return pubsubEnv(t, srv), func(int) []delivered {
				msgs := pubsubMessages(srv, "outbox.event.order")
				for _, m := range msgs {
					if want := "order/" + m.Attributes["aggregate_id"]; m.OrderingKey != want {
						t.Errorf("message %s: ordering key %q, want %q", m.ID, m.OrderingKey, want)
					}
				}
				return pubsubDelivered(msgs)
			}
		},
	}
}

// TestPubSubSinkFailures: a missing topic and a message above 10 MB
// (checkFailures).
func TestPubSubSinkFailures(t *testing.T) {
	t.Parallel()
	srv := pubsubServer(t, "outbox.event.order")
	checkFailures(t, failureCase{
		e: pubsubEnv(t, srv).set("OUTBOXD_POLLER_MAX_PAYLOAD_BYTES", strconv.Itoa(12<<20),
			"OUTBOXD_POLLER_BATCH_MAX_BYTES", strconv.Itoa(24<<20)),
		kind:     "topic",
		oversize: `"` + strings.Repeat("x", 10_500_000) + `"`, tooLarge: "larger than a Pub/Sub publish request allows",
		create: func() { createPubSubTopic(t, srv, "outbox.event.missing") },
		read:   func() []delivered { return pubsubDelivered(pubsubMessages(srv, "outbox.event.missing")) },
	})
}
