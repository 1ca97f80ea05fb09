// Package pubsub is the Google Cloud Pub/Sub sink: the Publish RPC of
// cloud.google.com/go/pubsub/v2's generated client, ordering key = the
// aggregate, the contract's headers as message attributes, a result per
// message. It imports nothing of outboxd but dispatch.
//
// What it promises: an event is Delivered only once Pub/Sub answered the
// publish request holding it with message ids; the events of one aggregate
// carry one ordering key ("<aggregate_type>/<aggregate_id>",
// dispatch.OrderingKey) and reach a topic in id order, so subscriptions with
// message ordering receive them in id order. A publish request succeeds or
// fails whole, requests go one after another, and after an aggregate's
// first failure none of its later events is sent (they are NotAttempted),
// so a failed event is never overtaken. What it does not: Pub/Sub does not
// dedupe publishes, so an event resent after a timeout can land twice;
// consumers dedupe on the id attribute.
//
// Why not the client's Publisher: with message ordering it bundles per
// ordering key, one Publish RPC per aggregate in flight, and pauses a key
// after a failure until ResumePublish. A batch spread over many aggregates
// then costs one RPC per aggregate, so the cost per event grows with the
// spread. Here a request holds many keys, in batch order; a failed
// key needs no resuming: it is not sent again until the poller retries its
// row.
//
// The sink never creates topics: a missing one is a retryable failure
// naming it.
package pubsub

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/outboxd/outboxd/dispatch"
)

// Defaults (docs/reference.md) for Config's zero fields.
const (
	DefaultTopic = "outbox.event.{aggregate_type}"
	// DefaultTimeout bounds one Send below the lease: the client retries a
	// publish request (UNAVAILABLE, INTERNAL ...) within it, and a message
	// without an answer by then is a retryable failure.
	DefaultTimeout = 10 * time.Second
)

// Pub/Sub's limits on a message (https://cloud.google.com/pubsub/quotas#resource_limits).
const (
	maxAttributes     = 100
	maxAttrKeyBytes   = 256
	maxAttrValueBytes = 1024
	maxOrderingKey    = 1024
)

// Binding is the CloudEvents Pub/Sub protocol binding (§3): binary mode
// puts each attribute in a ce- message attribute and datacontenttype in
// Content-Type (§3.1.1, as sdk-go's protocol/pubsub writes and reads it);
// structured mode sets Content-Type to application/cloudevents+json, which
// is how a receiver tells the modes apart, and sends no ce- attributes
// (sdk-go reads a message with ce-specversion as binary).
var Binding = dispatch.Binding{Prefix: "ce-", ContentTypeHeader: "Content-Type"}

// Pub/Sub's limits on a publish request: 1,000 messages, 10 MB; the client
// library's own constants.
const (
	maxRequestMessages = pubsub.MaxPublishRequestCount
	maxRequestBytes    = pubsub.MaxPublishRequestBytes
	// messageOverhead is what each message adds to a request beside its own
	// size (its field tag and length); requestOverhead the topic name's
	// field and a margin.
	messageOverhead = 5
	requestOverhead = 512
)

// Config configures the sink.
type Config struct {
	Project string // the Google Cloud project of the topics (required)
	Topic   string // topic ID template; DefaultTopic when empty
	// Endpoint overrides the service address: "http://host:port" is an
	// emulator (plaintext, no credentials), "https://host[:port]" a private
	// or regional endpoint (TLS, application default credentials). Empty:
	// Google's endpoint, or PUBSUB_EMULATOR_HOST when that is set.
	Endpoint    string
	CloudEvents dispatch.CloudEvents // Binding, binary or structured
	Log         *slog.Logger         // optional
	// Timeout bounds one Send (besides the batch's trust deadline);
	// DefaultTimeout when 0.
	Timeout time.Duration

	opts []option.ClientOption // tests
}

// Sink publishes batches to Pub/Sub. Create with New; Close when done.
type Sink struct {
	client   *pubsub.Client
	project  string
	topic    dispatch.Template
	ce       dispatch.CloudEvents
	log      *slog.Logger
	timeout  time.Duration
	mu       sync.Mutex // one Send at a time: batches reach each ordering key in order
	closeOne sync.Once
}

// ErrEndpoint: the endpoint does not say how to connect.
var ErrEndpoint = errors.New(`want "http://host:port" for an emulator (plaintext, no credentials) or "https://host[:port]" for a TLS endpoint with application default credentials`)

// CheckConfig checks what New checks without connecting: the project, the
// topic template and the endpoint. The error names the field
// ("project", "topic", "endpoint") in its text.
func CheckConfig(cfg Config) error {
	if cfg.Project == "" {
		return errors.New("pubsub: project: empty: name the Google Cloud project of the topics")
	}
	if _, err := ParseTopic(cmp.Or(cfg.Topic, DefaultTopic)); err != nil {
		return err
	}
	return CheckEndpoint(cfg.Endpoint)
}

// CheckEndpoint checks an endpoint as New reads it.
func CheckEndpoint(endpoint string) error {
	_, err := endpointOptions(endpoint)
	return err
}

// ParseTopic reads a topic ID template whose literal parts are valid in a
// topic ID, so only a row's values can make an invalid one (that row is
// dead-lettered).
func ParseTopic(s string) (dispatch.Template, error) {
	t, err := dispatch.ParseTemplate(s)
	if err != nil {
		return dispatch.Template{}, fmt.Errorf("pubsub: topic: %w", err)
	}
	if _, err := t.Render(dispatch.Event{AggregateType: "aaa", EventType: "eee"}, dispatch.NameRules{Kind: dispatch.PubSubTopic}); err != nil {
		return dispatch.Template{}, fmt.Errorf("pubsub: topic template %q: %w", s, err)
	}
	return t, nil
}

// endpointOptions are the client options for endpoint.
func endpointOptions(endpoint string) ([]option.ClientOption, error) {
	if endpoint == "" {
		return nil, nil
	}
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" || (u.Path != "" && u.Path != "/") || u.User != nil {
		return nil, fmt.Errorf("pubsub: endpoint %q: %w", endpoint, ErrEndpoint)
	}
	switch u.Scheme {
	case "http":
		// As the client does for PUBSUB_EMULATOR_HOST.
		return []option.ClientOption{option.WithEndpoint(u.Host), option.WithoutAuthentication(),
			option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())),
			option.WithTelemetryDisabled()}, nil
	case "https":
		host := u.Host
		if u.Port() == "" {
			host += ":443"
		}
		return []option.ClientOption{option.WithEndpoint(host)}, nil
	}
	return nil, fmt.Errorf("pubsub: endpoint %q: %w", endpoint, ErrEndpoint)
}

// New validates cfg and returns the sink. ctx is for setting up the client
// (credentials, connections); it is not kept. An unreachable service makes
// sends fail (retryable), never New; missing credentials fail New.
func New(ctx context.Context, cfg Config) (*Sink, error) {
	if err := CheckConfig(cfg); err != nil {
		return nil, err
	}
	topic, _ := ParseTopic(cmp.Or(cfg.Topic, DefaultTopic))
	opts, _ := endpointOptions(cfg.Endpoint)
	client, err := pubsub.NewClient(ctx, cfg.Project, append(opts, cfg.opts...)...)
	if err != nil {
		return nil, fmt.Errorf("pubsub: %w", err)
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Sink{client: client, project: cfg.Project, topic: topic, ce: cfg.CloudEvents, log: log,
		timeout: cmp.Or(cfg.Timeout, DefaultTimeout)}, nil
}

// Capabilities implements dispatch.Sink.
func (s *Sink) Capabilities() dispatch.Capabilities {
	return dispatch.Capabilities{
		MaxBatch:     0, // split into publish requests here
		DedupeWindow: 0,
		Ordering:     "per ordering key (aggregate_type/aggregate_id)",
	}
}

// Close disconnects. Every Send waited for its answers or gave up on them,
// so nothing is flushed. Safe to call more than once.
func (s *Sink) Close() error {
	s.closeOne.Do(func() { _ = s.client.Close() })
	return nil
}

// item is one event of a Send, ready to publish.
type item struct {
	i     int // index in the batch
	agg   dispatch.Aggregate
	topic string
	msg   *pubsubpb.PubsubMessage
	size  int
}

// Send implements dispatch.Sink. It publishes the batch in waves of
// requests, one topic at a time, each request at most 1,000 messages and
// 10 MB, in batch order. A wave holds each aggregate's events up to the
// first that goes to another topic than its first in the wave (a template
// with {event_type}); the rest wait for the next wave, so an aggregate's
// events reach their topics in id order whichever topic comes first. An
// aggregate whose request failed sends nothing more.
func (s *Sink) Send(ctx context.Context, b dispatch.Batch) []dispatch.Result {
	if len(b.Events) == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	start := time.Now()
	dctx, cancel, ok := b.Window(ctx)
	defer cancel()
	if !ok {
		return make([]dispatch.Result, len(b.Events)) // NotAttempted
	}
	tctx, cancelT := context.WithTimeout(dctx, s.timeout)
	defer cancelT()

	r := dispatch.NewRounds(b.Events)
	queue := make([]item, len(b.Events))
	var drops dispatch.DroppedHeaders
	for i, ev := range b.Events {
		it, dropped, err := s.item(i, ev, b.Token)
		drops.Add(ev.ID, dropped)
		if err != nil {
			r.Set(i, dispatch.Failed(err)) // its aggregate stops there
		}
		queue[i] = it
	}
	drops.Log(s.log, "row headers dropped: their names collide with the contract's headers, hold control characters or break Pub/Sub's attribute limits")

	requests := 0
	for len(queue) > 0 && tctx.Err() == nil {
		var wave map[string][]item
		var topics []string
		wave, topics, queue = nextWave(queue, r)
		for _, topic := range topics {
			for _, req := range requestsOf(wave[topic]) {
				// An earlier request of this wave failed for its aggregate.
				req = slices.DeleteFunc(req, func(it item) bool { return r.Stopped(it.i) })
				if len(req) == 0 || tctx.Err() != nil {
					continue // NotAttempted
				}
				requests++
				s.publish(tctx, dctx, topic, req, r)
			}
		}
	}
	out := r.Results()
	s.log.Debug("pubsub batch published", "batch_size", len(b.Events), "requests", requests, "duration_ms", time.Since(start).Milliseconds())
	return out
}

// nextWave takes from queue, in order, the events of this wave grouped by
// topic (topics in order of first use), and returns the rest for later
// waves. Events of stopped aggregates are dropped (NotAttempted), a
// refused event's aggregate stopped at it.
func nextWave(queue []item, r *dispatch.Rounds) (map[string][]item, []string, []item) {
	wave := map[string][]item{}
	var topics []string
	first := map[dispatch.Aggregate]string{} // the topic of the aggregate's first event in this wave
	deferred := map[dispatch.Aggregate]bool{}
	var rest []item
	for _, it := range queue {
		switch t, seen := first[it.agg]; {
		case r.Stopped(it.i):
		case deferred[it.agg] || (seen && t != it.topic):
			deferred[it.agg] = true
			rest = append(rest, it)
		default:
			if !seen {
				first[it.agg] = it.topic
			}
			if _, ok := wave[it.topic]; !ok {
				topics = append(topics, it.topic)
			}
			wave[it.topic] = append(wave[it.topic], it)
		}
	}
	return wave, topics, rest
}

// requestsOf splits one topic's items into publish requests within
// Pub/Sub's limits.
func requestsOf(items []item) [][]item {
	var out [][]item
	begin, bytes := 0, requestOverhead
	for i, it := range items {
		if i > begin && (i-begin == maxRequestMessages || bytes+it.size > maxRequestBytes) {
			out = append(out, items[begin:i])
			begin, bytes = i, requestOverhead
		}
		bytes += it.size
	}
	if begin < len(items) {
		out = append(out, items[begin:])
	}
	return out
}

// item maps event i to its message (dispatch.Encode in Binding): data =
// the payload as is (the CloudEvent in structured mode), attributes = the
// message's headers (what Pub/Sub's limits let through), ordering key =
// the aggregate; or a Permanent error: a refused topic ID, a message no
// request can hold.
func (s *Sink) item(i int, ev dispatch.Event, token int64) (item, []string, error) {
	it := item{i: i, agg: ev.Aggregate()}
	topic, err := s.topic.Render(ev, dispatch.NameRules{Kind: dispatch.PubSubTopic})
	if err != nil {
		return it, nil, fmt.Errorf("pubsub: %w: fix dispatch.pubsub.topic or the row's aggregate_type/event_type, then replay it", err)
	}
	it.topic = topic
	m := dispatch.Encode(ev, token, s.ce, Binding)
	dropped := m.Dropped
	attrs := make(map[string]string, len(m.Headers))
	for _, h := range m.Headers {
		// The contract's headers come first and always fit; the row's may not.
		if len(attrs) == maxAttributes || len(h.Key) > maxAttrKeyBytes || len(h.Value) > maxAttrValueBytes ||
			strings.HasPrefix(strings.ToLower(h.Key), "goog") {
			dropped = append(dropped, h.Key)
			continue
		}
		attrs[h.Key] = h.Value
	}
	data := m.Body
	if data == nil {
		data = []byte{}
	}
	it.msg = &pubsubpb.PubsubMessage{Data: data, Attributes: attrs, OrderingKey: dispatch.OrderingKey(ev, maxOrderingKey)}
	it.size = proto.Size(it.msg) + messageOverhead
	if it.size+requestOverhead > maxRequestBytes {
		return it, dropped, &dispatch.Error{Permanent: true, Err: fmt.Errorf(
			"pubsub: topic %q: event %d is a message of %d bytes, larger than a Pub/Sub publish request allows (10 MB); shrink the payload, then replay it",
			topic, ev.ID, it.size)}
	}
	return it, dropped, nil
}

// publish sends one request and sets its events' results in r; a failed
// request stops the aggregates of its events.
func (s *Sink) publish(tctx, dctx context.Context, topic string, req []item, r *dispatch.Rounds) {
	msgs := make([]*pubsubpb.PubsubMessage, len(req))
	for j, it := range req {
		msgs[j] = it.msg
	}
	resp, err := s.client.TopicAdminClient.Publish(tctx, &pubsubpb.PublishRequest{
		Topic: "projects/" + s.project + "/topics/" + topic, Messages: msgs})
	if err == nil && len(resp.MessageIds) != len(msgs) {
		err = fmt.Errorf("the answer has %d message ids for %d messages", len(resp.MessageIds), len(msgs))
	}
	if err != nil {
		res := s.failed(topic, err, dctx)
		for _, it := range req {
			r.Set(it.i, res)
		}
		return
	}
	for j, it := range req {
		r.Set(it.i, dispatch.Result{Outcome: dispatch.Delivered, Ref: topic + "/" + resp.MessageIds[j]})
	}
}

// failed is the Result of every event of a failed request, saying what to do.
func (s *Sink) failed(topic string, err error, dctx context.Context) dispatch.Result {
	switch code := status.Code(err); {
	case dctx.Err() != nil:
		r := dispatch.Failed(fmt.Errorf("pubsub: topic %q: not acknowledged before the lease's trust deadline or shutdown (%w): %w", topic, context.Cause(dctx), err))
		r.Cut = true
		return r
	case code == codes.NotFound:
		err = fmt.Errorf("pubsub: topic %q does not exist in project %q: create it; the event is retried: %w", topic, s.project, err)
	case code == codes.PermissionDenied || code == codes.Unauthenticated:
		err = fmt.Errorf("pubsub: topic %q: not allowed to publish: grant the credentials roles/pubsub.publisher on the topic; the event is retried: %w", topic, err)
	case code == codes.InvalidArgument:
		// The request as built was refused: retried, so one bad message
		// cannot dead-letter the others of its request at once.
		err = fmt.Errorf("pubsub: topic %q: Pub/Sub refused the publish request; the event is retried: %w", topic, err)
	case errors.Is(err, context.DeadlineExceeded) || code == codes.DeadlineExceeded:
		err = fmt.Errorf("pubsub: topic %q: not acknowledged within %s: the service is unreachable or slow; the event is retried: %w", topic, s.timeout, err)
	default:
		err = fmt.Errorf("pubsub: topic %q: %w; the event is retried", topic, err)
	}
	return dispatch.Failed(err)
}
