package kafka

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/internal/testkit"
)

// No Postgres or Redis here: plain TestMain, still leak-checked.
func TestMain(m *testing.M) {
	testkit.VerifyTestMain(m)
}

// waitTimeout bounds every wait for a condition.
const waitTimeout = 20 * time.Second

// realBrokersEnv points the "real" variant of each test at a Kafka cluster.
const realBrokersEnv = "OUTBOXD_TEST_KAFKA_BROKERS"

// cluster is where a test produces: kfake in this process, or a real
// cluster (OUTBOXD_TEST_KAFKA_BROKERS) shared by tests with their own topics.
type cluster struct {
	t       testing.TB
	brokers []string
	fake    *kfake.Cluster // nil on a real cluster
	admin   *kgo.Client
	prefix  string // this test's topic prefix
}

// clusters runs fn against kfake and, when OUTBOXD_TEST_KAFKA_BROKERS is
// set, against that cluster (skipped otherwise).
func clusters(t *testing.T, fn func(t *testing.T, c *cluster)) {
	t.Run("kfake", func(t *testing.T) {
		t.Parallel()
		fn(t, newFake(t))
	})
	t.Run("real", func(t *testing.T) {
		brokers := os.Getenv(realBrokersEnv)
		if brokers == "" {
			t.Skip(realBrokersEnv + " not set")
		}
		t.Parallel()
		fn(t, newCluster(t, strings.Split(brokers, ","), nil))
	})
}

// newFake starts a one-broker kfake cluster, closed at cleanup.
func newFake(t testing.TB, opts ...kfake.Opt) *cluster {
	t.Helper()
	fake, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	return newCluster(t, fake.ListenAddrs(), fake)
}

func newCluster(t testing.TB, brokers []string, fake *kfake.Cluster, adminOpts ...kgo.Opt) *cluster {
	t.Helper()
	admin, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, adminOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	name := regexp.MustCompile(`[^a-zA-Z0-9]+`).ReplaceAllString(t.Name(), "-")
	return &cluster{t: t, brokers: brokers, fake: fake, admin: admin, prefix: fmt.Sprintf("%s.%s", clip(name, 120), randomHex(3))}
}

// needFake skips a test that needs kfake's fault hooks on a real cluster.
func (c *cluster) needFake() {
	c.t.Helper()
	if c.fake == nil {
		c.t.Skip("needs kfake's fault injection")
	}
}

// topic is this test's topic name for suffix.
func (c *cluster) topic(suffix string) string { return c.prefix + "." + suffix }

// create makes topics with partitions each (the cluster's default
// replication factor: Kafka 2.4 or later); on a real cluster they are
// deleted at cleanup.
func (c *cluster) create(partitions int32, topics ...string) {
	c.t.Helper()
	req := kmsg.NewPtrCreateTopicsRequest()
	req.TimeoutMillis = 10000
	for _, name := range topics {
		rt := kmsg.NewCreateTopicsRequestTopic()
		rt.Topic, rt.NumPartitions, rt.ReplicationFactor = name, partitions, -1
		req.Topics = append(req.Topics, rt)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	resp, err := req.RequestWith(ctx, c.admin)
	if err != nil {
		c.t.Fatalf("create topics %v: %v", topics, err)
	}
	for _, rt := range resp.Topics {
		if err := kerr.ErrorForCode(rt.ErrorCode); err != nil {
			c.t.Fatalf("create topic %s: %v", rt.Topic, err)
		}
	}
	c.deleteAtCleanup(topics...)
}

// deleteAtCleanup deletes topics from a real cluster when the test ends
// (kfake goes away by itself).
func (c *cluster) deleteAtCleanup(topics ...string) {
	if c.fake != nil {
		return
	}
	c.t.Cleanup(func() {
		del := kmsg.NewPtrDeleteTopicsRequest()
		del.TimeoutMillis = 10000
		for _, name := range topics {
			dt := kmsg.NewDeleteTopicsRequestTopic()
			dt.Topic = kmsg.StringPtr(name)
			del.Topics = append(del.Topics, dt)
			del.TopicNames = append(del.TopicNames, name)
		}
		_, _ = del.RequestWith(context.Background(), c.admin)
	})
}

// landed returns every record in topic, partition by partition, each in
// offset order: the end offsets are read first, so it waits for nothing.
func (c *cluster) landed(topic string) []*kgo.Record {
	c.t.Helper()
	ends := c.endOffsets(topic)
	total := int64(0)
	offsets := map[int32]kgo.Offset{}
	for p, end := range ends {
		total += end
		offsets[p] = kgo.NewOffset().AtStart()
	}
	if total == 0 {
		return nil
	}
	cons, err := kgo.NewClient(kgo.SeedBrokers(c.brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: offsets}),
		kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		c.t.Fatal(err)
	}
	defer cons.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	var out []*kgo.Record
	for int64(len(out)) < total {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			c.t.Fatalf("consumed %d of the %d records in %s", len(out), total, topic)
		}
		fs.EachError(func(t string, p int32, err error) { c.t.Fatalf("fetch %s/%d: %v", t, p, err) })
		out = append(out, fs.Records()...)
	}
	return out
}

// endOffsets are topic's partitions' high watermarks.
func (c *cluster) endOffsets(topic string) map[int32]int64 {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	meta := kmsg.NewPtrMetadataRequest()
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr(topic)
	meta.Topics = append(meta.Topics, mt)
	mresp, err := meta.RequestWith(ctx, c.admin)
	if err != nil || len(mresp.Topics) != 1 {
		c.t.Fatalf("metadata of %s: %v", topic, err)
	}
	if err := kerr.ErrorForCode(mresp.Topics[0].ErrorCode); err != nil {
		if err == kerr.UnknownTopicOrPartition {
			return nil
		}
		c.t.Fatalf("metadata of %s: %v", topic, err)
	}
	lo := kmsg.NewPtrListOffsetsRequest()
	lo.ReplicaID = -1
	lt := kmsg.NewListOffsetsRequestTopic()
	lt.Topic = topic
	for _, p := range mresp.Topics[0].Partitions {
		lp := kmsg.NewListOffsetsRequestTopicPartition()
		lp.Partition, lp.Timestamp = p.Partition, -1 // latest
		lt.Partitions = append(lt.Partitions, lp)
	}
	lo.Topics = append(lo.Topics, lt)
	// Sharded to each partition's leader by the client.
	lresp, err := lo.RequestWith(ctx, c.admin)
	if err != nil {
		c.t.Fatalf("list offsets of %s: %v", topic, err)
	}
	ends := map[int32]int64{}
	for _, rt := range lresp.Topics {
		for _, rp := range rt.Partitions {
			if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
				c.t.Fatalf("list offsets of %s/%d: %v", topic, rp.Partition, err)
			}
			ends[rp.Partition] = rp.Offset
		}
	}
	return ends
}

// sink builds a sink on c with the topic template, closed at cleanup.
func (c *cluster) sink(template string, change ...func(*Config)) *Sink {
	c.t.Helper()
	cfg := Config{Brokers: c.brokers, Topic: template, Log: slog.New(slog.NewJSONHandler(testkit.Writer(c.t), nil))}
	for _, f := range change {
		f(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		c.t.Fatalf("New: %v", err)
	}
	c.t.Cleanup(func() { _ = s.Close() })
	return s
}

// created is every test event's created_at.
var created = time.Date(2025, 3, 4, 5, 6, 7, 891000000, time.UTC)

// event is a test event with payload {"n":id}.
func event(id int64, aggType, aggID string) dispatch.Event {
	return dispatch.Event{ID: id, AggregateType: aggType, AggregateID: aggID, EventType: "test.event",
		Payload: json.RawMessage(`{"n":` + strconv.FormatInt(id, 10) + `}`), Headers: json.RawMessage(`{}`), CreatedAt: created}
}

// testToken is the fencing token of every test batch.
const testToken = 7

// batch is a batch with a trust deadline a minute away.
func batch(events ...dispatch.Event) dispatch.Batch {
	until := time.Now().Add(time.Minute)
	return dispatch.Batch{Events: events, Token: testToken, Until: func() time.Time { return until }}
}

// send sends b and checks there is one result per event.
func send(t *testing.T, s *Sink, b dispatch.Batch) []dispatch.Result {
	t.Helper()
	out := s.Send(context.Background(), b)
	if len(out) != len(b.Events) {
		t.Fatalf("%d results for %d events", len(out), len(b.Events))
	}
	return out
}

// delivers sends b until every event is Delivered: after a failure is
// fixed the client may need a few tries (reconnect backoff, leftovers of
// an earlier batch) under a short Config.Timeout. Anything but Retryable
// or NotAttempted on the way fails the test.
func delivers(t *testing.T, s *Sink, b dispatch.Batch) {
	t.Helper()
	var out []dispatch.Result
	for range 20 {
		out = send(t, s, b)
		done := true
		for i, r := range out {
			switch r.Outcome {
			case dispatch.Delivered:
			case dispatch.Retryable, dispatch.NotAttempted:
				done = false
			default:
				t.Fatalf("event %d: %s %v", b.Events[i].ID, r.Outcome, r.Err)
			}
		}
		if done {
			return
		}
	}
	t.Fatalf("not all delivered after 20 sends: %v", out)
}

// wantOutcomes checks each result's outcome, in order.
func wantOutcomes(t *testing.T, got []dispatch.Result, want ...dispatch.Outcome) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d results, want %d", len(got), len(want))
	}
	for i := range got {
		if got[i].Outcome != want[i] {
			t.Errorf("result %d: %s (err %v), want %s", i, got[i].Outcome, got[i].Err, want[i])
		}
	}
}

// header is the value of a record's header key ("" and false if absent).
func header(r *kgo.Record, key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

// ids are the records' id headers.
func ids(t *testing.T, rs []*kgo.Record) []int64 {
	t.Helper()
	out := make([]int64, len(rs))
	for i, r := range rs {
		v, _ := header(r, dispatch.HeaderID)
		id, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("record %s/%d@%d: id header %q", r.Topic, r.Partition, r.Offset, v)
		}
		out[i] = id
	}
	return out
}

// ref is a record's position as the sink writes it.
func ref(r *kgo.Record) string { return fmt.Sprintf("%s/%d@%d", r.Topic, r.Partition, r.Offset) }

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
