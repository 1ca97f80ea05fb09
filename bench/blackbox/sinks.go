package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxd/outboxd/bench/benchenv"
	"github.com/outboxd/outboxd/internal/testenv"
)

// drainTopic is where the default templates (topic, subject, routing key,
// stream: outbox.event.{aggregate_type}) put the drain's rows, all of
// aggregate_type 'deal'.
const drainTopic = "outbox.event.deal"

// noopSink selects the sink that delivers nothing (the drain's default and
// the latency scenario's).
const noopSink = "dispatch.sink=noop"

// destination is where one drain's relay delivers: what a user would have
// set up before starting outboxd, the --set pairs that point the relay at
// it, and what removes it afterwards.
type destination struct {
	sets []string
	// received is how many messages the destination holds (nil: it cannot
	// tell), so a drain that counted rows the broker never took shows.
	received func() int64
	close    func()
}

// expect says whether the destination holds the n events the relay counted
// as dispatched: fewer is a broken run; more are redeliveries, which
// at-least-once allows but are worth seeing in a throughput figure.
func (d destination) expect(sink string, n int) {
	if d.received == nil {
		return
	}
	switch got := d.received(); {
	case got < int64(n):
		check(fmt.Errorf("sink %s: the destination holds %d messages for %d events marked dispatched", sink, got, n))
	case got > int64(n):
		fmt.Fprintf(os.Stderr, "sink %s: %d messages for %d events (redeliveries)\n", sink, got, n)
	}
}

// sinkList is -sink split, each name checked before any run starts.
func sinkList() []string {
	var out []string
	for _, s := range strings.Split(*sinks, ",") {
		s = strings.TrimSpace(s)
		switch s {
		case "noop", "webhook", "kafka", "nats", "rabbitmq", "redis_stream", "pubsub", "kinesis", "sqs", "sns":
			out = append(out, s)
		default:
			check(fmt.Errorf("unknown -sink %q (noop, webhook, kafka, nats, rabbitmq, redis_stream, pubsub, kinesis, sqs, sns)", s))
		}
	}
	return out
}

// openDestination sets up the sink's destination for the run with this key
// prefix; rdb is the run's Redis.
func openDestination(ctx context.Context, sink, prefix string, rdb *redis.Client) destination {
	// NATS stream and RabbitMQ exchange names come from the run's prefix, so
	// a run killed half-way leaves names that say where they came from.
	name := "outboxd_bench_" + strings.ReplaceAll(strings.TrimSuffix(prefix, ":"), ":", "_")
	switch sink {
	case "webhook":
		return webhookReceiver()
	case "kafka":
		return kafkaCluster(ctx)
	case "nats":
		return natsStream(ctx, name)
	case "rabbitmq":
		return rabbitQueue(name)
	case "pubsub":
		return pubsubEmulator(ctx)
	case "kinesis":
		return kinesisEmulator(ctx)
	case "sqs", "sns":
		return awsQueue(ctx, sink)
	case "redis_stream":
		// The sink puts redis.key_prefix before the stream, so the run's
		// CleanKeys removes it with the lock's keys.
		key := prefix + drainTopic
		return destination{
			sets:     []string{"dispatch.sink=redis_stream"},
			received: func() int64 { n, err := rdb.XLen(ctx, key).Result(); check(err); return n },
			close:    func() {},
		}
	}
	return destination{sets: []string{noopSink}, close: func() {}}
}

// webhookReceiver answers every POST with a 200 at once, so the figure is
// the relay's and its HTTP client's, not a receiver's.
func webhookReceiver() destination {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	var n atomic.Int64
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Read the body so the connection is kept alive for the next event.
		_, _ = io.Copy(io.Discard, r.Body)
		n.Add(1)
		w.WriteHeader(http.StatusOK)
	})}
	go func() { _ = srv.Serve(ln) }()
	return destination{
		sets:     []string{"dispatch.sink=webhook", "dispatch.webhook.url=http://" + ln.Addr().String() + "/events"},
		received: n.Load,
		close:    func() { _ = srv.Close() },
	}
}

// kafkaPartitions is how many partitions the drain's topic has, as in the
// black-box tests and the sink's own benchmark.
const kafkaPartitions = 3

// kafkaCluster starts kfake, franz-go's fake cluster, in this process on a
// loopback port with the drain's topic seeded: outboxd never creates
// topics, and kfake does not create them on request either. Its CPU is the
// bench's, not the relay's.
func kafkaCluster(ctx context.Context) destination {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(kafkaPartitions, drainTopic))
	check(err)
	return destination{
		sets:     []string{"dispatch.sink=kafka", "dispatch.kafka.brokers=" + strings.Join(c.ListenAddrs(), ",")},
		received: func() int64 { return kafkaEndOffsets(ctx, c) },
		close:    c.Close,
	}
}

// kafkaEndOffsets sums the topic's partitions' end offsets: the records
// the cluster took, without reading them back.
func kafkaEndOffsets(ctx context.Context, c *kfake.Cluster) int64 {
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	check(err)
	defer cl.Close()
	topic := kmsg.NewListOffsetsRequestTopic()
	topic.Topic = drainTopic
	for p := range int32(kafkaPartitions) {
		part := kmsg.NewListOffsetsRequestTopicPartition()
		part.Partition, part.Timestamp = p, -1 // -1: the latest offset
		topic.Partitions = append(topic.Partitions, part)
	}
	req := kmsg.NewPtrListOffsetsRequest()
	req.Topics = append(req.Topics, topic)
	resp, err := req.RequestWith(ctx, cl)
	check(err)
	var n int64
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			check(kerr.ErrorForCode(p.ErrorCode))
			n += p.Offset
		}
	}
	return n
}

// pubsubEmulator starts pstest, the Pub/Sub client library's emulator, in
// this process on a loopback port (the relay reaches it over gRPC, as an
// emulator), with the drain's topic. Its CPU is the bench's, not the
// relay's.
func pubsubEmulator(ctx context.Context) destination {
	const project = "outboxd-bench"
	srv := pstest.NewServerWithAddress("127.0.0.1:0")
	topic := "projects/" + project + "/topics/" + drainTopic
	_, err := srv.GServer.CreateTopic(ctx, &pubsubpb.Topic{Name: topic})
	check(err)
	return destination{
		sets: []string{"dispatch.sink=pubsub", "dispatch.pubsub.project=" + project, "dispatch.pubsub.endpoint=http://" + srv.Addr},
		received: func() int64 {
			var n int64
			for _, m := range srv.Messages() {
				if m.Topic == topic {
					n++
				}
			}
			return n
		},
		close: func() { _ = srv.Close() },
	}
}

// kinesisShards is how many shards the drain's stream has.
const kinesisShards = 4

// kinesisEmulator starts kinesalite (npm, installed on first use into
// testenv.KinesaliteDir) on a free loopback port with the drain's stream.
// kinesalite is a Node.js process of its own: its CPU is in no column.
func kinesisEmulator(ctx context.Context) destination {
	k, err := testenv.RunKinesalite(ctx, freePortNumber())
	check(err)
	check(k.CreateStream(ctx, drainTopic, kinesisShards))
	// The relay's AWS SDK reads its credentials from the environment;
	// kinesalite accepts any.
	check(os.Setenv("AWS_ACCESS_KEY_ID", "bench"))
	check(os.Setenv("AWS_SECRET_ACCESS_KEY", "bench"))
	return destination{
		sets: []string{"dispatch.sink=kinesis", "dispatch.kinesis.region=us-east-1", "dispatch.kinesis.endpoint=" + k.Endpoint},
		received: func() int64 {
			recs, err := k.Records(ctx, drainTopic)
			check(err)
			return int64(len(recs))
		},
		close: k.Stop,
	}
}

// natsStream creates a JetStream stream for the subjects "<name>.>" and
// points the sink's subject template at them. Memory storage, like the
// sink's own benchmark in BENCHMARKS.md, so the two figures compare.
func natsStream(ctx context.Context, name string) destination {
	nc, err := nats.Connect(benchenv.NATSURL())
	check(err)
	js, err := jetstream.New(nc)
	check(err)
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: jetstream.MemoryStorage})
	check(err)
	return destination{
		sets: []string{"dispatch.sink=nats", "dispatch.nats.url=" + benchenv.NATSURL(), "dispatch.nats.subject=" + name + ".{aggregate_type}"},
		received: func() int64 {
			info, err := st.Info(ctx)
			check(err)
			return int64(info.State.Msgs)
		},
		close: func() {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			_ = js.DeleteStream(ctx, name)
			nc.Close()
		},
	}
}

// rabbitQueue declares the exchange the sink publishes to and one durable
// queue bound to every key: without a queue every message is unroutable,
// which the sink counts as a failure.
func rabbitQueue(name string) destination {
	conn, err := amqp.Dial(benchenv.RabbitMQURL())
	check(err)
	ch, err := conn.Channel()
	check(err)
	check(ch.ExchangeDeclare(name, amqp.ExchangeTopic, true, false, false, false, nil))
	_, err = ch.QueueDeclare(name, true, false, false, false, nil)
	check(err)
	check(ch.QueueBind(name, "#", name, false, nil))
	return destination{
		sets: []string{"dispatch.sink=rabbitmq", "dispatch.rabbitmq.url=" + benchenv.RabbitMQURL(), "dispatch.rabbitmq.exchange=" + name},
		received: func() int64 {
			q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
			check(err)
			return int64(q.Messages)
		},
		close: func() {
			_, _ = ch.QueueDelete(name, false, false, false)
			_ = ch.ExchangeDelete(name, false, false)
			_ = conn.Close()
		},
	}
}

// awsQueue starts moto_server (internal/testenv) on a loopback port with a
// standard queue, and for sns a standard topic that the queue subscribes
// to with raw delivery. The relay gets the emulator's credentials through
// the environment it inherits (the SDK's default chain). A consumer in the
// bench receives and deletes as messages come, as a deployment's would:
// moto's send slows down with the queue's length (each 500 more messages
// held added about 25 s per 500 sent, measured here), so a queue left to
// fill would time moto, not the relay. moto is Python, in its own process:
// its CPU is neither the relay's nor the bench's, and it bounds the figure.
func awsQueue(ctx context.Context, sink string) destination {
	port, err := strconv.Atoi(freePort()[len("127.0.0.1:"):])
	check(err)
	log, err := os.CreateTemp("", "outboxd-bench-moto-*.log")
	check(err)
	check(log.Close())
	m, err := testenv.StartMotoServer(ctx, port, log.Name())
	check(err)
	atExit(m.Stop) // a bench that fails leaves no emulator running
	for _, kv := range m.Env() {
		k, v, _ := strings.Cut(kv, "=")
		check(os.Setenv(k, v))
	}
	url := m.CreateQueue(exitTB{}, "outboxd-bench", nil)
	sets := []string{"dispatch.sink=sqs", "dispatch.sqs.queue_url=" + url, "dispatch.sqs.endpoint=" + m.Endpoint}
	if sink == "sns" {
		sets = []string{"dispatch.sink=sns", "dispatch.sns.topic_arn=" + m.CreateTopic(exitTB{}, "outboxd-bench", url), "dispatch.sns.endpoint=" + m.Endpoint}
	}
	cctx, stop := context.WithCancel(ctx)
	var consumed atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() { consumeQueue(cctx, m, url, &consumed) })
	return destination{
		sets: sets,
		// What the consumer took, and what it had not reached yet.
		received: func() int64 {
			stop()
			wg.Wait()
			left, err := m.Count(ctx, url)
			check(err)
			return consumed.Load() + int64(left)
		},
		close: func() {
			stop()
			wg.Wait()
			m.Stop()
			_ = os.Remove(log.Name())
		},
	}
}

// consumeQueue receives and deletes the queue's messages until ctx ends,
// counting them.
func consumeQueue(ctx context.Context, m *testenv.Moto, url string, n *atomic.Int64) {
	c := m.SQS()
	for ctx.Err() == nil {
		out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(url), MaxNumberOfMessages: 10, WaitTimeSeconds: 1})
		if err != nil || len(out.Messages) == 0 {
			continue
		}
		del := &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(url)}
		for i, msg := range out.Messages {
			del.Entries = append(del.Entries, sqstypes.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: msg.ReceiptHandle})
		}
		if _, err := c.DeleteMessageBatch(ctx, del); err == nil {
			n.Add(int64(len(out.Messages)))
		}
	}
}

// arrivals records when the receiver first got each event (by its
// Idempotency-Key, the outbox id).
type arrivals struct {
	mu  sync.Mutex
	at  map[int64]time.Time
	seq []int64 // ids in the order of their first arrival
}

// order is the ids among want in the order they first arrived.
func (a *arrivals) order(want ...int64) []int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []int64
	for _, id := range a.seq {
		if slices.Contains(want, id) {
			out = append(out, id)
		}
	}
	return out
}

func (a *arrivals) first(id int64) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.at[id]
}

// arrivalReceiver is a webhook receiver for the latency scenario: it
// answers 200 at once and notes each event's first arrival.
func arrivalReceiver() (*arrivals, []string, func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	a := &arrivals{at: map[int64]time.Time{}}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		_, _ = io.Copy(io.Discard, r.Body)
		if id, err := strconv.ParseInt(r.Header.Get("Idempotency-Key"), 10, 64); err == nil {
			a.mu.Lock()
			if _, seen := a.at[id]; !seen {
				a.at[id] = now
				a.seq = append(a.seq, id)
			}
			a.mu.Unlock()
		}
		w.WriteHeader(http.StatusOK)
	})}
	go func() { _ = srv.Serve(ln) }()
	return a, []string{"dispatch.sink=webhook", "dispatch.webhook.url=http://" + ln.Addr().String() + "/events"}, func() { _ = srv.Close() }
}
