package sinktest_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/dispatch"
	isink "github.com/outboxd/outboxd/dispatch/internal/sinktest"
	"github.com/outboxd/outboxd/dispatch/kafka"
	"github.com/outboxd/outboxd/dispatch/kinesis"
	dnats "github.com/outboxd/outboxd/dispatch/nats"
	"github.com/outboxd/outboxd/dispatch/pubsub"
	"github.com/outboxd/outboxd/dispatch/rabbitmq"
	"github.com/outboxd/outboxd/dispatch/redisstream"
	"github.com/outboxd/outboxd/dispatch/sinktest"
	"github.com/outboxd/outboxd/dispatch/sns"
	"github.com/outboxd/outboxd/dispatch/sqs"
	"github.com/outboxd/outboxd/dispatch/webhook"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/internal/testkit"
)

func TestMain(m *testing.M) {
	// Kinesalite accepts any credentials, but the SDK signs requests.
	for k, v := range map[string]string{"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"} {
		if os.Getenv(k) == "" {
			_ = os.Setenv(k, v)
		}
	}
	testenv.Main(m)
}

// readWait bounds every wait for a destination to hold what was sent.
const readWait = 30 * time.Second

// poisoned is the event_type a harness's destination template sends
// nowhere (or its receiver refuses).
const poisoned = "order.poisoned"

// TestConformance runs the suite against every sink, each against a real
// broker or emulator.
func TestConformance(t *testing.T) {
	t.Parallel()
	for name, setup := range map[string]func(t *testing.T) func(t *testing.T) sinktest.Target{
		"webhook":      webhookTarget,
		"kafka":        kafkaTarget,
		"nats":         natsTarget,
		"rabbitmq":     rabbitmqTarget,
		"redis_stream": redisStreamTarget,
		"sqs":          sqsTarget,
		"sns":          snsTarget,
		"pubsub":       pubsubTarget,
		"kinesis":      kinesisTarget,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			sinktest.Run(t, setup(t))
		})
	}
}

func randomHex() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func poisonType(ev *dispatch.Event) { ev.EventType = poisoned }

// aggregateKey is the ordering key of the sinks that carry the aggregate as
// "<aggregate_type>/<aggregate_id>".
func aggregateKey(ev dispatch.Event) string { return ev.AggregateType + "/" + ev.AggregateID }

// aggregateID is the ordering key of the sinks that carry aggregate_id.
func aggregateID(ev dispatch.Event) string { return ev.AggregateID }

// eventually calls read until it returns at least n messages or readWait
// passes (then fails t).
func eventually(t *testing.T, n int, read func() []sinktest.Message) []sinktest.Message {
	t.Helper()
	var got []sinktest.Message
	testkit.WaitFor(t, readWait, fmt.Sprintf("the destination to hold %d messages", n), func() bool {
		got = read()
		return len(got) >= n
	}, func() string { return fmt.Sprintf("it holds %d", len(got)) })
	return got
}

// ---- webhook: an httptest receiver that answers 503 to poisoned events ----

func webhookTarget(*testing.T) func(t *testing.T) sinktest.Target {
	return func(t *testing.T) sinktest.Target {
		var mu sync.Mutex
		var got []sinktest.Message
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			var env struct {
				ID            int64             `json:"id"`
				AggregateType string            `json:"aggregate_type"`
				AggregateID   string            `json:"aggregate_id"`
				EventType     string            `json:"event_type"`
				Payload       json.RawMessage   `json:"payload"`
				Headers       map[string]string `json:"headers"`
				CreatedAt     string            `json:"created_at"`
			}
			if err := json.Unmarshal(body, &env); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			if env.EventType == poisoned {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			h := map[string]string{"id": strconv.FormatInt(env.ID, 10), "aggregate_type": env.AggregateType,
				"aggregate_id": env.AggregateID, "event_type": env.EventType, "created_at": env.CreatedAt,
				"fencing_token": r.Header.Get("X-Fencing-Token")}
			for k, v := range env.Headers {
				h[k] = v
			}
			mu.Lock()
			got = append(got, sinktest.Message{Headers: h, Body: string(env.Payload), Key: env.AggregateID,
				DedupeID: r.Header.Get("Idempotency-Key")})
			mu.Unlock()
		}))
		t.Cleanup(srv.Close)
		w, err := webhook.New(webhook.Config{URL: srv.URL, Concurrency: 4})
		if err != nil {
			t.Fatal(err)
		}
		return sinktest.Target{Sink: w, Poison: poisonType, Key: aggregateID,
			DedupeID: func(ev dispatch.Event) string { return strconv.FormatInt(ev.ID, 10) },
			Read: func(t *testing.T, n int) []sinktest.Message {
				return eventually(t, n, func() []sinktest.Message {
					mu.Lock()
					defer mu.Unlock()
					return append([]sinktest.Message(nil), got...)
				})
			}}
	}
}

// ---- kafka: kfake, one topic; a record above MaxMessageBytes is refused ----

func kafkaTarget(*testing.T) func(t *testing.T) sinktest.Target {
	const maxBytes = 64 << 10
	return func(t *testing.T) sinktest.Target {
		fake, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "conformance"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(fake.Close)
		s, err := kafka.New(kafka.Config{Brokers: fake.ListenAddrs(), Topic: "conformance", MaxMessageBytes: maxBytes,
			Log: testkit.Logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return sinktest.Target{Sink: s, Key: aggregateID, MaxPayload: maxBytes,
			Poison: oversized(maxBytes),
			Read: func(t *testing.T, n int) []sinktest.Message {
				return readKafka(t, fake.ListenAddrs(), n)
			}}
	}
}

func readKafka(t *testing.T, brokers []string, n int) []sinktest.Message {
	t.Helper()
	c, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("conformance"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(t.Context(), readWait)
	defer cancel()
	var out []sinktest.Message
	for len(out) < n && ctx.Err() == nil {
		c.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			h := map[string]string{}
			for _, x := range r.Headers {
				h[x.Key] = string(x.Value)
			}
			out = append(out, sinktest.Message{Headers: h, Body: string(r.Value), Key: string(r.Key)})
		})
	}
	if len(out) < n {
		t.Fatalf("kafka: %d records, want at least %d", len(out), n)
	}
	return out
}

// ---- nats: the machine's server, a stream that captures only EventType ----

func natsTarget(*testing.T) func(t *testing.T) sinktest.Target {
	url := os.Getenv("OUTBOXD_TEST_NATS_URL")
	if url == "" {
		url = "nats://127.0.0.1:4222"
	}
	return func(t *testing.T) sinktest.Target {
		nc, err := nats.Connect(url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		prefix := "conf" + randomHex()
		name := strings.ToUpper(prefix)
		stream, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: name,
			Subjects: []string{prefix + "." + sinktest.EventType}, Storage: jetstream.MemoryStorage})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = js.DeleteStream(context.WithoutCancel(t.Context()), name) })
		s, err := dnats.New(dnats.Config{URL: url, Subject: prefix + ".{event_type}", Log: testkit.Logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return sinktest.Target{Sink: s, Poison: poisonType, Key: aggregateID, MaxPayload: int(nc.MaxPayload()),
			DedupeID: func(ev dispatch.Event) string { return ev.DedupeID() },
			Read: func(t *testing.T, n int) []sinktest.Message {
				return eventually(t, n, func() []sinktest.Message { return readNATS(t, stream) })
			}}
	}
}

func readNATS(t *testing.T, stream jetstream.Stream) []sinktest.Message {
	info, err := stream.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var out []sinktest.Message
	for seq := info.State.FirstSeq; seq > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := stream.GetMsg(t.Context(), seq)
		if err != nil {
			t.Fatal(err)
		}
		h := map[string]string{}
		for k := range m.Header {
			h[k] = m.Header.Get(k)
		}
		out = append(out, sinktest.Message{Headers: h, Body: string(m.Data), Key: h["aggregate_id"], DedupeID: h[jetstream.MsgIDHeader]})
	}
	return out
}

// ---- rabbitmq: the machine's broker, a queue bound to EventType only ----

func rabbitmqTarget(*testing.T) func(t *testing.T) sinktest.Target {
	url := os.Getenv("OUTBOXD_TEST_RABBITMQ_URL")
	if url == "" {
		url = rabbitmq.DefaultURL
	}
	return func(t *testing.T) sinktest.Target {
		conn, err := amqp.Dial(url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		exchange := "conformance." + randomHex()
		if err := ch.ExchangeDeclare(exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ch.ExchangeDelete(exchange, false, false) })
		q, err := ch.QueueDeclare("", false, true, true, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := ch.QueueBind(q.Name, sinktest.EventType, exchange, false, nil); err != nil {
			t.Fatal(err)
		}
		s, err := rabbitmq.New(rabbitmq.Config{URL: url, Exchange: exchange, RoutingKey: "{event_type}", Log: testkit.Logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		var got []sinktest.Message
		return sinktest.Target{Sink: s, Poison: poisonType, Key: aggregateID,
			Read: func(t *testing.T, n int) []sinktest.Message {
				return eventually(t, n, func() []sinktest.Message {
					for {
						d, ok, err := ch.Get(q.Name, true)
						if err != nil {
							t.Fatal(err)
						}
						if !ok {
							return got
						}
						h := map[string]string{}
						for k, v := range d.Headers {
							h[k] = fmt.Sprint(v)
						}
						got = append(got, sinktest.Message{Headers: h, Body: string(d.Body), Key: h["aggregate_id"]})
					}
				})
			}}
	}
}

// ---- redis_stream: the test Redis; the poisoned stream key holds a string ----

func redisStreamTarget(*testing.T) func(t *testing.T) sinktest.Target {
	return func(t *testing.T) sinktest.Target {
		client, prefix := testenv.Redis(t)
		if err := client.Set(t.Context(), prefix+poisoned, "not a stream", 0).Err(); err != nil {
			t.Fatal(err)
		}
		s, err := redisstream.New(redisstream.Config{Client: client, Stream: "{event_type}", KeyPrefix: prefix, Log: testkit.Logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return sinktest.Target{Sink: s, Poison: poisonType, Key: aggregateID,
			Read: func(t *testing.T, n int) []sinktest.Message {
				return eventually(t, n, func() []sinktest.Message { return readStream(t, client, prefix+sinktest.EventType) })
			}}
	}
}

func readStream(t *testing.T, client *redis.Client, key string) []sinktest.Message {
	entries, err := client.XRange(t.Context(), key, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	var out []sinktest.Message
	for _, e := range entries {
		h := map[string]string{}
		for k, v := range e.Values {
			h[k] = fmt.Sprint(v)
		}
		out = append(out, sinktest.Message{Headers: h, Body: h[redisstream.PayloadField], Key: h["aggregate_id"]})
	}
	return out
}

// ---- sqs and sns: moto_server, FIFO; a message above 256 KiB is refused ----

// SNS refuses a message above 256 KiB; the SQS queue is made to take at
// most sqsMaxMessage bytes (moto does not apply SQS's default).
const (
	snsMaxMessage = 256 << 10
	sqsMaxMessage = 1 << 10
)

// oversized changes an event's payload to one of max bytes and more.
func oversized(max int) func(ev *dispatch.Event) {
	return func(ev *dispatch.Event) { ev.Payload = json.RawMessage(`"` + strings.Repeat("x", max) + `"`) }
}

func sqsMessages(t *testing.T, msgs []sqstypes.Message) []sinktest.Message {
	var out []sinktest.Message
	for _, m := range msgs {
		own := map[string]string{}
		for k, v := range m.MessageAttributes {
			own[k] = aws.ToString(v.StringValue)
		}
		h, err := isink.Unpacked(own)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, sinktest.Message{Headers: h, Body: aws.ToString(m.Body),
			Key:      m.Attributes[string(sqstypes.MessageSystemAttributeNameMessageGroupId)],
			DedupeID: m.Attributes[string(sqstypes.MessageSystemAttributeNameMessageDeduplicationId)]})
	}
	return out
}

func awsOptions(m *testenv.Moto) []func(*config.LoadOptions) error {
	return []func(*config.LoadOptions) error{config.WithCredentialsProvider(m.Credentials())}
}

func sqsTarget(t *testing.T) func(t *testing.T) sinktest.Target {
	m := testenv.StartMoto(t)
	return func(t *testing.T) sinktest.Target {
		url := m.CreateQueue(t, "q"+randomHex()+".fifo", map[string]string{"MaximumMessageSize": strconv.Itoa(sqsMaxMessage)})
		s, err := sqs.New(t.Context(), sqs.Config{QueueURL: url, Region: testenv.MotoRegion, Endpoint: m.Endpoint,
			Log: testkit.Logger(t), Options: awsOptions(m)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return awsTarget(s, m, url, sqsMaxMessage)
	}
}

func snsTarget(t *testing.T) func(t *testing.T) sinktest.Target {
	m := testenv.StartMoto(t)
	return func(t *testing.T) sinktest.Target {
		name := "t" + randomHex()
		url := m.CreateQueue(t, name+".fifo", nil)
		arn := m.CreateTopic(t, name+".fifo", url)
		s, err := sns.New(t.Context(), sns.Config{TopicARN: arn, Endpoint: m.Endpoint, Log: testkit.Logger(t), Options: awsOptions(m)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return awsTarget(s, m, url, snsMaxMessage)
	}
}

func awsTarget(s dispatch.Sink, m *testenv.Moto, queueURL string, max int) sinktest.Target {
	var got []sinktest.Message
	return sinktest.Target{Sink: s, Poison: oversized(max), Key: aggregateKey, MaxPayload: max,
		DedupeID: func(ev dispatch.Event) string { return ev.DedupeID() },
		Read: func(t *testing.T, n int) []sinktest.Message {
			if n > len(got) {
				got = append(got, sqsMessages(t, m.Receive(t, queueURL, n-len(got)))...)
			}
			return got
		}}
}

// ---- pubsub: pstest; the poisoned event's topic does not exist ----

func pubsubTarget(*testing.T) func(t *testing.T) sinktest.Target {
	const project = "conformance"
	return func(t *testing.T) sinktest.Target {
		srv := pstest.NewServerWithAddress("127.0.0.1:0")
		t.Cleanup(func() { _ = srv.Close() })
		if _, err := srv.GServer.CreateTopic(t.Context(), &pubsubpb.Topic{Name: "projects/" + project + "/topics/" + sinktest.EventType}); err != nil {
			t.Fatal(err)
		}
		s, err := pubsub.New(t.Context(), pubsub.Config{Project: project, Topic: "{event_type}", Endpoint: "http://" + srv.Addr,
			Log: testkit.Logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return sinktest.Target{Sink: s, Poison: poisonType, Key: aggregateKey, MaxPayload: 10 << 20,
			Read: func(t *testing.T, n int) []sinktest.Message {
				return eventually(t, n, func() []sinktest.Message {
					var out []sinktest.Message
					for _, m := range srv.Messages() {
						out = append(out, sinktest.Message{Headers: m.Attributes, Body: string(m.Data), Key: m.OrderingKey})
					}
					return out
				})
			}}
	}
}

// ---- kinesis: kinesalite; the poisoned event's stream does not exist ----

func kinesisTarget(t *testing.T) func(t *testing.T) sinktest.Target {
	k := testenv.StartKinesalite(t)
	return func(t *testing.T) sinktest.Target {
		prefix := "conf" + randomHex() + "-"
		stream := prefix + sinktest.EventType
		if err := k.CreateStream(t.Context(), stream, 1); err != nil {
			t.Fatal(err)
		}
		s, err := kinesis.New(t.Context(), kinesis.Config{Stream: prefix + "{event_type}", Region: "us-east-1", Endpoint: k.Endpoint,
			Log: testkit.Logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		return sinktest.Target{Sink: s, Poison: poisonType, Key: aggregateKey, MaxPayload: 1 << 20,
			Read: func(t *testing.T, n int) []sinktest.Message {
				return eventually(t, n, func() []sinktest.Message {
					recs, err := k.Records(t.Context(), stream)
					if err != nil {
						t.Fatal(err)
					}
					var out []sinktest.Message
					for _, r := range recs {
						var env struct {
							Headers map[string]string `json:"headers"`
							Payload json.RawMessage   `json:"payload"`
						}
						if err := json.Unmarshal(r.Data, &env); err != nil {
							t.Fatal(err)
						}
						out = append(out, sinktest.Message{Headers: env.Headers, Body: string(env.Payload), Key: r.PartitionKey})
					}
					return out
				})
			}}
	}
}
