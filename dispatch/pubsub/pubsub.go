// Package pubsub is the Google Cloud Pub/Sub sink: cloud.google.com/go/pubsub/v2
// with message ordering, ordering key = the aggregate, the contract's
// headers as message attributes, a result per message. It imports nothing
// of outboxd but dispatch.
//
// What it promises: an event is Delivered only once Pub/Sub answered its
// publish with a message id; the events of one aggregate are published with
// one ordering key ("<aggregate_type>/<aggregate_id>", dispatch.OrderingKey)
// in the batch's order, so subscriptions with message ordering receive them
// in id order; after an aggregate's first failure its later events are
// NotAttempted. A failed publish makes the client pause its ordering key
// (later messages of the key fail at once, so none overtakes it); the sink
// resumes the key once every message of it that was in flight has an
// answer and the failure is recorded, so the row is retried later. What it
// does not: Pub/Sub does not dedupe publishes, so an event resent after a
// cut or a timeout can land twice; consumers dedupe on the id attribute.
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
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/outboxd/outboxd/dispatch"
)

// Defaults (docs/reference.md) for Config's zero fields.
const (
	DefaultTopic = "outbox.event.{aggregate_type}"
	// DefaultTimeout bounds one Send below the lease: the client retries a
	// publish (UNAVAILABLE, INTERNAL ...) within it, and a message without
	// an answer by then is a retryable failure.
	DefaultTimeout = 10 * time.Second
)

// Pub/Sub's limits on a message (https://cloud.google.com/pubsub/quotas#resource_limits).
const (
	maxAttributes     = 100
	maxAttrKeyBytes   = 256
	maxAttrValueBytes = 1024
	maxOrderingKey    = 1024
)

// cePrefix is the CloudEvents Pub/Sub binding's attribute prefix.
const cePrefix = "ce-"

// delayThreshold is how long the client waits to fill a publish request
// of one ordering key. A Send hands over its whole batch, then waits, so
// the client's 10 ms default would only delay each batch's last requests.
const delayThreshold = time.Millisecond

// Config configures the sink.
type Config struct {
	Project string // the Google Cloud project of the topics (required)
	Topic   string // topic ID template; DefaultTopic when empty
	// Endpoint overrides the service address: "http://host:port" is an
	// emulator (plaintext, no credentials), "https://host[:port]" a private
	// or regional endpoint (TLS, application default credentials). Empty:
	// Google's endpoint, or PUBSUB_EMULATOR_HOST when that is set.
	Endpoint    string
	CloudEvents dispatch.CloudEvents // ce- attributes
	Log         *slog.Logger         // optional
	// Timeout bounds one Send (besides the batch's trust deadline);
	// DefaultTimeout when 0.
	Timeout time.Duration

	opts []option.ClientOption // tests
}

// Sink publishes batches to Pub/Sub. Create with New; Close when done.
type Sink struct {
	client  *pubsub.Client
	project string
	topic   dispatch.Template
	ce      dispatch.CloudEvents
	log     *slog.Logger
	timeout time.Duration

	mu         sync.Mutex // one Send at a time: batches reach each ordering key in order
	publishers map[string]*pubsub.Publisher
	keys       keys // ordering keys with messages in flight or a failure to resume
	closeOne   sync.Once
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
		timeout: cmp.Or(cfg.Timeout, DefaultTimeout), publishers: map[string]*pubsub.Publisher{}, keys: keys{}}, nil
}

// Capabilities implements dispatch.Sink.
func (s *Sink) Capabilities() dispatch.Capabilities {
	return dispatch.Capabilities{
		MaxBatch:     0, // the client bundles per ordering key itself
		DedupeWindow: 0,
		Ordering:     "per ordering key (aggregate_type/aggregate_id), message ordering enabled",
	}
}

// Close stops the publishers (each waits for its messages in flight, up to
// the timeout) and disconnects. Safe to call more than once.
func (s *Sink) Close() error {
	s.closeOne.Do(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, p := range s.publishers {
			p.Stop()
		}
		_ = s.client.Close()
	})
	return nil
}

// publisher returns the topic's publisher, made on first use. Callers hold mu.
func (s *Sink) publisher(topic string) *pubsub.Publisher {
	p, ok := s.publishers[topic]
	if !ok {
		p = s.client.Publisher(topic)
		p.EnableMessageOrdering = true
		p.PublishSettings.DelayThreshold = delayThreshold
		p.PublishSettings.Timeout = s.timeout
		s.publishers[topic] = p
	}
	return p
}

// Send implements dispatch.Sink. It publishes the whole batch at once,
// each message with its aggregate's ordering key, and waits for every
// answer, bounded by the batch's trust deadline and the sink's timeout.
func (s *Sink) Send(ctx context.Context, b dispatch.Batch) []dispatch.Result {
	if len(b.Events) == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	start := time.Now()
	s.keys.settle(ctx, s.log) // answers that came after an earlier Send stopped waiting
	out := make([]dispatch.Result, len(b.Events))
	dctx, cancel, ok := b.Window(ctx)
	defer cancel()
	if !ok {
		return out // NotAttempted
	}
	tctx, cancelT := context.WithTimeout(dctx, s.timeout)
	defer cancelT()

	sent := make([]*message, len(b.Events))
	var drops dispatch.DroppedHeaders
	for i, ev := range b.Events {
		if tctx.Err() != nil {
			break // never published: the rest stay NotAttempted
		}
		topic, err := s.topic.Render(ev, dispatch.NameRules{Kind: dispatch.PubSubTopic})
		if err != nil {
			out[i] = dispatch.Failed(fmt.Errorf("pubsub: %w: fix dispatch.pubsub.topic or the row's aggregate_type/event_type, then replay it", err))
			continue
		}
		msg, dropped := s.message(ev, b.Token)
		drops.Add(ev.ID, dropped)
		p := s.publisher(topic)
		m := &message{topic: topic, key: key{topic, msg.OrderingKey}, pub: p, res: p.Publish(tctx, msg)}
		s.keys.add(m)
		sent[i] = m
	}
	drops.Log(s.log, "row headers dropped: their names collide with the contract's headers, hold control characters or break Pub/Sub's attribute limits")
	for i, m := range sent {
		if m == nil {
			continue
		}
		select {
		case <-m.res.Ready():
		case <-tctx.Done():
		}
		out[i] = s.result(b.Events[i].ID, m, dctx, tctx)
	}
	dispatch.KeepPrefix(b.Events, out)
	// Only now, with every failure recorded above, may a paused key take
	// messages again: the poller retries its row later, in order.
	s.keys.settle(ctx, s.log)
	s.log.Debug("pubsub batch published", "batch_size", len(b.Events), "duration_ms", time.Since(start).Milliseconds())
	return out
}

// message maps an event to its Pub/Sub message: data = the payload as is,
// attributes = dispatch.Headers (what Pub/Sub's limits let through),
// ordering key = the aggregate.
func (s *Sink) message(ev dispatch.Event, token int64) (*pubsub.Message, []string) {
	hs, dropped := dispatch.Headers(ev, token, s.ce, cePrefix)
	attrs := make(map[string]string, len(hs))
	for _, h := range hs {
		// The contract's headers come first and always fit; the row's may not.
		if len(attrs) == maxAttributes || len(h.Key) > maxAttrKeyBytes || len(h.Value) > maxAttrValueBytes ||
			strings.HasPrefix(strings.ToLower(h.Key), "goog") {
			dropped = append(dropped, h.Key)
			continue
		}
		attrs[h.Key] = h.Value
	}
	return &pubsub.Message{Data: ev.Payload, Attributes: attrs, OrderingKey: dispatch.OrderingKey(ev, maxOrderingKey)}, dropped
}

// result reads m's answer: Delivered with the message id, or a failure.
func (s *Sink) result(id int64, m *message, dctx, tctx context.Context) dispatch.Result {
	select {
	case <-m.res.Ready():
	default:
		r := dispatch.Failed(fmt.Errorf("pubsub: topic %q: event %d: not acknowledged within %s: the service is unreachable or slow; the event is retried", m.topic, id, s.timeout))
		if dctx.Err() != nil {
			r = dispatch.Failed(fmt.Errorf("pubsub: topic %q: event %d: not acknowledged before the lease's trust deadline or shutdown (%w)", m.topic, id, context.Cause(dctx)))
			r.Cut = true
		}
		return r
	}
	// Ready: Get does not block. Given a context that may have ended, it
	// could report that instead of the answer.
	msgID, err := m.res.Get(context.WithoutCancel(tctx))
	s.keys.answered(m, err)
	if err == nil {
		return dispatch.Result{Outcome: dispatch.Delivered, Ref: m.topic + "/" + msgID}
	}
	return dispatch.Failed(s.classify(id, m.topic, err))
}

// classify turns a publish error into a *dispatch.Error that says what to do.
func (s *Sink) classify(id int64, topic string, err error) error {
	var paused pubsub.ErrPublishingPaused
	switch code := status.Code(err); {
	case errors.As(err, &paused):
		return fmt.Errorf("pubsub: topic %q: event %d: not published: an earlier message of its ordering key %q failed; the event is retried", topic, id, paused.OrderingKey)
	case errors.Is(err, pubsub.ErrOversizedMessage):
		return &dispatch.Error{Permanent: true, Err: fmt.Errorf("pubsub: topic %q: event %d is larger than a Pub/Sub publish request allows (10 MB): %w; shrink the payload, then replay it", topic, id, err)}
	case code == codes.NotFound:
		return fmt.Errorf("pubsub: topic %q does not exist in project %q (event %d): create it; the event is retried: %w", topic, s.project, id, err)
	case code == codes.PermissionDenied || code == codes.Unauthenticated:
		return fmt.Errorf("pubsub: topic %q: event %d: not allowed to publish: grant the credentials roles/pubsub.publisher on the topic; the event is retried: %w", topic, id, err)
	case code == codes.InvalidArgument:
		return &dispatch.Error{Permanent: true, Err: fmt.Errorf("pubsub: topic %q: event %d: Pub/Sub refused the message: %w; fix it, then replay it", topic, id, err)}
	case errors.Is(err, context.DeadlineExceeded) || code == codes.DeadlineExceeded:
		return fmt.Errorf("pubsub: topic %q: event %d: not acknowledged within %s: the service is unreachable or slow; the event is retried: %w", topic, id, s.timeout, err)
	default:
		return fmt.Errorf("pubsub: topic %q: event %d: %w", topic, id, err)
	}
}

// message is one published message of a Send.
type message struct {
	topic string
	key   key
	pub   *pubsub.Publisher
	res   *pubsub.PublishResult
	read  bool // its answer is counted in keys
}

// key is an ordering key of a topic: the client pauses keys per publisher.
type key struct{ topic, ordering string }

// keys tracks, per ordering key, the messages without a counted answer
// and whether one failed. A failed key is resumed only once none of its
// messages is in flight: resuming earlier would let a later message of the
// key, already queued, go out after a failed earlier one. Used under
// Sink.mu.
type keys map[key]*keyState

type keyState struct {
	pub      *pubsub.Publisher
	inflight []*message
	failed   bool
}

func (k keys) add(m *message) {
	st := k[m.key]
	if st == nil {
		st = &keyState{pub: m.pub}
		k[m.key] = st
	}
	st.inflight = append(st.inflight, m)
}

// answered counts m's answer.
func (k keys) answered(m *message, err error) {
	if m.read {
		return
	}
	m.read = true
	if st := k[m.key]; st != nil && err != nil {
		st.failed = true
	}
}

// settle counts the answers that have come, then resumes each failed key
// with nothing left in flight and forgets the keys that are done.
func (k keys) settle(ctx context.Context, log *slog.Logger) {
	for ok, st := range k {
		rest := st.inflight[:0]
		for _, m := range st.inflight {
			select {
			case <-m.res.Ready():
				if !m.read {
					_, err := m.res.Get(context.WithoutCancel(ctx)) // ready: does not block
					k.answered(m, err)
				}
			default:
				rest = append(rest, m)
			}
		}
		clear(st.inflight[len(rest):])
		st.inflight = rest
		if len(rest) > 0 {
			continue
		}
		if st.failed {
			st.pub.ResumePublish(ok.ordering)
			log.Debug("pubsub: ordering key resumed after a failure", "topic", ok.topic, "ordering_key", ok.ordering)
		}
		delete(k, ok)
	}
}
