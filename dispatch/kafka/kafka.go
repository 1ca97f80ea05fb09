// Package kafka is the Kafka sink: franz-go, record key = aggregate_id,
// acks from all in-sync replicas, idempotent producer, one produce call per
// batch with a result per record. It imports nothing of outboxd but
// dispatch.
//
// What it promises: an event is Delivered only once every in-sync replica of
// its partition has acknowledged its record; the events of one aggregate go
// to one partition per topic (the key's murmur2 hash, as Java clients pick),
// in the batch's order; after an aggregate's first failure its later events
// are NotAttempted, even if the broker took them. What it does not: the
// idempotent producer drops a retried record only within one producer
// session, so an event resent by the poller (after a cut, a timeout or a
// restart) can land twice; consumers dedupe on the id header.
//
// The sink never creates topics. Its metadata requests allow auto-creation,
// so a cluster with auto.create.topics.enable creates them as it would for
// a Java producer; otherwise a missing topic is a retryable failure naming
// the topic.
package kafka

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/outboxd/outboxd/dispatch"
)

// Defaults (docs/reference.md, and this sink's own) for Config's zero fields.
const (
	DefaultTopic    = "outbox.event.{aggregate_type}"
	DefaultClientID = "outboxd"
	// DefaultTimeout bounds one Send below the lease: a cluster that does
	// not acknowledge within it (down, no leader, overloaded) fails the
	// batch's unacknowledged events as retryable, counted attempts.
	DefaultTimeout = 10 * time.Second
	// DefaultMaxMessageBytes is the largest record batch the producer
	// builds: Kafka's default message.max.bytes (broker) and
	// max.message.bytes (topic). A record above it is MESSAGE_TOO_LARGE
	// (dead-lettered) without being sent.
	DefaultMaxMessageBytes = 1048588
)

// metadataMinAge is how soon franz-go may refresh metadata again when it
// needs to (an unknown topic, a moved leader). Its default of 5 s makes a
// missing topic slow to report and a created one slow to be used; a short
// age lets both show within the producer's first few retries.
const metadataMinAge = 200 * time.Millisecond

// SASL authenticates to the brokers; Mechanism "" means none.
type SASL struct {
	Mechanism string // PLAIN, SCRAM-SHA-256, SCRAM-SHA-512
	Username  string
	Password  string
}

// Config configures the sink.
type Config struct {
	Brokers     []string             // host:port seeds
	Topic       string               // template; DefaultTopic when empty
	ClientID    string               // DefaultClientID when empty
	SASL        SASL                 //
	TLS         *tls.Config          // nil: plaintext
	CloudEvents dispatch.CloudEvents // dispatch.KafkaBinding: ce_ headers, content-type
	Log         *slog.Logger         // optional
	// Timeout bounds one Send (besides the batch's trust deadline);
	// DefaultTimeout when 0.
	Timeout time.Duration
	// MaxMessageBytes is the largest record batch, and so record, the
	// producer sends; DefaultMaxMessageBytes when 0. Raise it only with the
	// brokers' message.max.bytes and the topics' max.message.bytes.
	MaxMessageBytes int

	hooks []kgo.Hook // tests watch the client
}

// Sink produces batches to Kafka. Create with New; Close when done.
type Sink struct {
	client   *kgo.Client
	topic    dispatch.Template
	ce       dispatch.CloudEvents
	log      *slog.Logger
	timeout  time.Duration
	conn     *connErrors
	unacked  *unacked
	mu       sync.Mutex // one Send at a time: batches reach the wire in order
	closeOne sync.Once
}

// New validates cfg and returns the sink. It does not wait for the brokers:
// an unreachable cluster makes sends fail (retryable), never New.
func New(cfg Config) (*Sink, error) {
	if err := CheckBrokers(cfg.Brokers); err != nil {
		return nil, err
	}
	topic, err := ParseTopic(cmp.Or(cfg.Topic, DefaultTopic))
	if err != nil {
		return nil, err
	}
	mech, err := mechanism(cfg.SASL)
	if err != nil {
		return nil, err
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	maxBytes := cmp.Or(cfg.MaxMessageBytes, DefaultMaxMessageBytes)
	if maxBytes < 0 || maxBytes > 1<<30 {
		return nil, fmt.Errorf("kafka: max message bytes %d: want 1 to %d", maxBytes, 1<<30)
	}
	s := &Sink{topic: topic, ce: cfg.CloudEvents, log: log, timeout: cmp.Or(cfg.Timeout, DefaultTimeout),
		conn: &connErrors{sasl: mech != nil}, unacked: newUnacked()}
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ClientID(cmp.Or(cfg.ClientID, DefaultClientID)),
		kgo.RequiredAcks(kgo.AllISRAcks()), // idempotent writes (the default) need it
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		kgo.ProducerBatchMaxBytes(int32(maxBytes)),
		kgo.AllowAutoTopicCreation(), // only where the cluster allows it
		kgo.MetadataMinAge(metadataMinAge),
		// A Send hands over its whole batch, then waits: lingering would
		// only delay the last request (10 ms per batch at the default).
		kgo.ProducerLinger(0),
		kgo.WithHooks(append([]kgo.Hook{s.conn}, cfg.hooks...)...),
		kgo.WithLogger(logger{log}),
	}
	if mech != nil {
		opts = append(opts, kgo.SASL(mech))
		if cfg.TLS == nil && mech.Name() == "PLAIN" {
			log.Warn("kafka: SASL PLAIN without TLS sends the password in clear text; set dispatch.kafka.tls.enabled")
		}
	}
	if cfg.TLS != nil {
		opts = append(opts, kgo.DialTLSConfig(cfg.TLS.Clone()))
	}
	client, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka: %w", err)
	}
	s.client = client
	return s, nil
}

// ParseTopic reads a topic template (dispatch.ParseTemplate) whose literal
// parts are valid in a Kafka topic name, so only a row's values can make
// an invalid one (that row is dead-lettered).
func ParseTopic(s string) (dispatch.Template, error) {
	t, err := dispatch.ParseTemplate(s)
	if err != nil {
		return dispatch.Template{}, fmt.Errorf("kafka: topic: %w", err)
	}
	// Expanded with values that are valid themselves, only the literal
	// parts can be wrong.
	if _, err := t.Render(dispatch.Event{AggregateType: "a", EventType: "e"}, dispatch.NameRules{Kind: dispatch.KafkaTopic}); err != nil {
		return dispatch.Template{}, fmt.Errorf("kafka: topic template %q: %w", s, err)
	}
	return t, nil
}

// CheckBrokers checks the seeds are host:port. Values that look like URLs
// are not quoted: they may carry credentials.
func CheckBrokers(brokers []string) error {
	if len(brokers) == 0 {
		return errors.New("kafka: no brokers: list at least one host:port in dispatch.kafka.brokers")
	}
	for i, b := range brokers {
		if strings.Contains(b, "://") || strings.Contains(b, "@") {
			return fmt.Errorf("kafka: broker %d: want host:port, not a URL (credentials go in dispatch.kafka.sasl)", i+1)
		}
		host, port, err := net.SplitHostPort(b)
		if err != nil || host == "" {
			return fmt.Errorf("kafka: broker %d %q: want host:port", i+1, b)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("kafka: broker %d %q: port must be 1 to 65535", i+1, b)
		}
	}
	return nil
}

// ErrSASLUsername: a SASL mechanism is set without a username.
var ErrSASLUsername = errors.New("a SASL mechanism needs a username")

// CheckSASL checks the SASL settings as New uses them: a mechanism named in
// any case, and a username with it. The error wraps ErrSASLUsername when the
// username is what is missing.
func CheckSASL(cfg SASL) error {
	_, err := mechanism(cfg)
	return err
}

// mechanism builds the SASL mechanism cfg asks for, nil for none.
func mechanism(cfg SASL) (sasl.Mechanism, error) {
	if cfg.Mechanism == "" {
		return nil, nil
	}
	m := strings.ToUpper(cfg.Mechanism)
	if m != "PLAIN" && m != "SCRAM-SHA-256" && m != "SCRAM-SHA-512" {
		return nil, fmt.Errorf("kafka: SASL mechanism %q: want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", cfg.Mechanism)
	}
	if cfg.Username == "" {
		return nil, fmt.Errorf("kafka: SASL %s: %w (dispatch.kafka.sasl.username)", cfg.Mechanism, ErrSASLUsername)
	}
	switch m {
	case "PLAIN":
		return plain.Auth{User: cfg.Username, Pass: cfg.Password}.AsMechanism(), nil
	case "SCRAM-SHA-256":
		return scram.Auth{User: cfg.Username, Pass: cfg.Password}.AsSha256Mechanism(), nil
	default:
		return scram.Auth{User: cfg.Username, Pass: cfg.Password}.AsSha512Mechanism(), nil
	}
}

// Capabilities implements dispatch.Sink.
func (s *Sink) Capabilities() dispatch.Capabilities {
	return dispatch.Capabilities{
		MaxBatch:     0, // franz-go splits a batch into produce requests itself
		DedupeWindow: 0, // the idempotent producer dedupes its own retries only, within one session
		Ordering:     "per partition (key = aggregate_id)",
	}
}

// Close disconnects. Every Send waited for its acks, or gave up on them
// and reported the events retryable, so nothing is flushed. Safe to call
// more than once.
func (s *Sink) Close() error {
	s.closeOne.Do(s.client.Close)
	return nil
}

// Send implements dispatch.Sink. It produces the whole batch at once,
// bounded by the batch's trust deadline and the sink's timeout, and waits
// for every record's acknowledgement, or for the bound.
func (s *Sink) Send(ctx context.Context, b dispatch.Batch) []dispatch.Result {
	if len(b.Events) == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	start := time.Now()
	// Trust the lease less than Redis does: nothing is produced past it.
	dctx, cancel := context.WithDeadline(ctx, b.Until())
	defer cancel()
	tctx, cancelT := context.WithTimeout(dctx, s.timeout)
	defer cancelT()
	if !s.unacked.wait(tctx) {
		return s.blocked(b, dctx)
	}

	p := newPending(len(b.Events))
	var drops dispatch.DroppedHeaders
	for i, ev := range b.Events {
		if tctx.Err() != nil {
			break // never produced: the rest stay NotAttempted
		}
		topic, err := s.topic.Render(ev, dispatch.NameRules{Kind: dispatch.KafkaTopic})
		if err != nil {
			p.fail(i, fmt.Errorf("kafka: %w: fix dispatch.kafka.topic or the row's aggregate_type/event_type, then replay it (INVALID_TOPIC_EXCEPTION)", err))
			continue
		}
		rec, dropped := s.record(ev, topic, b.Token)
		drops.Add(ev.ID, dropped)
		p.started(i, topic)
		s.unacked.add()
		s.client.Produce(tctx, rec, func(r *kgo.Record, err error) {
			p.done(i, r, err)
			s.unacked.done()
		})
	}
	p.seal()
	drops.Log(s.log, "row headers dropped: their names collide with the contract's headers or they hold control characters")
	select {
	case <-p.all:
	case <-tctx.Done():
	}
	out := p.results(func(i int, topic string, err error) dispatch.Result {
		return s.classify(b.Events[i].ID, topic, err, dctx, tctx, start)
	})
	dispatch.KeepPrefix(b.Events, out)
	s.log.Debug("kafka batch produced", "batch_size", len(b.Events), "duration_ms", time.Since(start).Milliseconds())
	return out
}

// blocked is the batch's Results when records of an earlier batch are still
// unanswered: producing now could fail this batch with the earlier one
// (franz-go fails a partition's buffered records together, by the oldest
// one's context). Nothing is produced.
func (s *Sink) blocked(b dispatch.Batch, dctx context.Context) []dispatch.Result {
	out := make([]dispatch.Result, len(b.Events))
	if dctx.Err() != nil {
		return out // the deadline came first: NotAttempted
	}
	s.log.Warn("kafka: an earlier batch's records are still unanswered by the brokers; batch not sent", "batch_size", len(b.Events), "outbox_id", b.Events[0].ID)
	for i, ev := range b.Events {
		out[i] = dispatch.Failed(fmt.Errorf("kafka: event %d: not sent: the brokers have not answered an earlier batch's records within %s (unreachable, no leader, or overloaded); the event is retried", ev.ID, s.timeout))
	}
	dispatch.KeepPrefix(b.Events, out)
	return out
}

// record maps an event to its Kafka record: key = aggregate_id, value =
// the payload as is (or the structured CloudEvent), headers per
// dispatch.Encode. The timestamp is left to
// the producer (now): a row's created_at, which may be days old after a
// replay, would put the record at once past the topic's retention.ms.
func (s *Sink) record(ev dispatch.Event, topic string, token int64) (*kgo.Record, []string) {
	m := dispatch.Encode(ev, token, s.ce, dispatch.KafkaBinding)
	headers := make([]kgo.RecordHeader, len(m.Headers))
	for i, h := range m.Headers {
		headers[i] = kgo.RecordHeader{Key: h.Key, Value: []byte(h.Value)}
	}
	value := m.Body
	if value == nil {
		value = []byte{} // a record with a nil value is a tombstone on a compacted topic
	}
	return &kgo.Record{Topic: topic, Key: []byte(ev.AggregateID), Value: value, Headers: headers}, m.Dropped
}

// classify turns a failed record's error into a Result; nil means the
// wait ended without an answer.
func (s *Sink) classify(id int64, topic string, err error, dctx, tctx context.Context, start time.Time) dispatch.Result {
	var e *dispatch.Error
	switch {
	case err == nil:
		return s.unacknowledged(id, topic, dctx, tctx, start)
	case errors.Is(err, kerr.MessageTooLarge), errors.Is(err, kerr.RecordListTooLarge):
		e = &dispatch.Error{Permanent: true, Err: fmt.Errorf("kafka: topic %q: event %d is larger than the cluster or the producer accepts: %w; "+
			"raise the topic's max.message.bytes, the brokers' message.max.bytes and dispatch.kafka.max_message_bytes, or shrink the payload, then replay it", topic, id, err)}
	case errors.Is(err, kerr.InvalidTopicException):
		e = &dispatch.Error{Permanent: true, Err: fmt.Errorf("kafka: topic %q: event %d: the cluster refuses the topic name: %w; fix dispatch.kafka.topic, then replay it", topic, id, err)}
	case errors.Is(err, kerr.UnknownTopicOrPartition):
		e = &dispatch.Error{Err: fmt.Errorf("kafka: topic %q does not exist (event %d): create it (this cluster does not create topics on first use); the event is retried: %w", topic, id, err)}
	case errors.Is(err, kerr.TopicAuthorizationFailed):
		e = &dispatch.Error{Err: fmt.Errorf("kafka: topic %q: event %d: not authorized to write: grant the sink's principal WRITE and DESCRIBE on the topic; the event is retried: %w", topic, id, err)}
	case errors.Is(err, kerr.ClusterAuthorizationFailed):
		e = &dispatch.Error{Err: fmt.Errorf("kafka: topic %q: event %d: the cluster refused the idempotent producer: grant the sink's principal IDEMPOTENT_WRITE on the cluster (Kafka before 2.8); the event is retried: %w", topic, id, err)}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded), errors.Is(err, kgo.ErrRecordTimeout):
		return s.unacknowledged(id, topic, dctx, tctx, start)
	case errors.Is(err, kgo.ErrClientClosed):
		e = &dispatch.Error{Err: fmt.Errorf("kafka: topic %q: event %d: the sink is closed", topic, id)}
	default:
		e = &dispatch.Error{Err: fmt.Errorf("kafka: topic %q: event %d: %w%s", topic, id, err, s.conn.since(start))}
	}
	return dispatch.Failed(e)
}

// unacknowledged is the Result of a record without an answer when the
// wait ended: Cut if the trust deadline or the caller's context ended it,
// a plain retryable failure if the sink's own timeout did.
func (s *Sink) unacknowledged(id int64, topic string, dctx, tctx context.Context, start time.Time) dispatch.Result {
	if dctx.Err() != nil {
		r := dispatch.Failed(fmt.Errorf("kafka: topic %q: event %d: not acknowledged before the lease's trust deadline or shutdown (%w)%s",
			topic, id, context.Cause(dctx), s.conn.since(start)))
		r.Cut = true
		return r
	}
	what := "not acknowledged"
	if tctx.Err() != nil {
		what = fmt.Sprintf("not acknowledged within %s", s.timeout)
	}
	return dispatch.Failed(fmt.Errorf("kafka: topic %q: event %d: %s: the brokers are unreachable, the partition has no leader, or the cluster is overloaded; the event is retried%s",
		topic, id, what, s.conn.since(start)))
}

// pending collects one Send's answers. franz-go calls done from its own
// goroutine, possibly after Send has returned (a record in flight when the
// wait ended), so results copies them out under the lock.
type pending struct {
	mu      sync.Mutex
	waiting int // started records without an answer, +1 until sealed
	state   []recState
	all     chan struct{} // closed once sealed and every started record has an answer
}

type recState struct {
	topic             string
	started, answered bool
	rec               *kgo.Record
	err               error
	decided           *dispatch.Result // a failure decided without producing
}

func newPending(n int) *pending {
	return &pending{state: make([]recState, n), all: make(chan struct{}), waiting: 1}
}

// fail records a failure decided without producing.
func (p *pending) fail(i int, err error) {
	r := dispatch.Failed(err)
	p.mu.Lock()
	p.state[i].decided = &r
	p.mu.Unlock()
}

// started: record i, for topic, is being produced.
func (p *pending) started(i int, topic string) {
	p.mu.Lock()
	p.state[i].started, p.state[i].topic = true, topic
	p.waiting++
	p.mu.Unlock()
}

// seal: no more records will be started.
func (p *pending) seal() { p.answer(func() {}) }

// done is record i's promise.
func (p *pending) done(i int, r *kgo.Record, err error) {
	p.answer(func() { p.state[i].answered, p.state[i].rec, p.state[i].err = true, r, err })
}

func (p *pending) answer(set func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	set()
	p.waiting--
	if p.waiting == 0 {
		close(p.all)
	}
}

// results are the answers so far: Delivered with the record's position;
// failures and records without an answer (nil error) through classify;
// never-produced events NotAttempted.
func (p *pending) results(classify func(i int, topic string, err error) dispatch.Result) []dispatch.Result {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]dispatch.Result, len(p.state))
	for i, st := range p.state {
		switch {
		case st.decided != nil:
			out[i] = *st.decided
		case !st.started:
		case !st.answered:
			out[i] = classify(i, st.topic, nil)
		case st.err != nil:
			out[i] = classify(i, st.topic, st.err)
		default:
			out[i] = dispatch.Result{Outcome: dispatch.Delivered, Ref: fmt.Sprintf("%s/%d@%d", st.rec.Topic, st.rec.Partition, st.rec.Offset)}
		}
	}
	return out
}

// connErrors remembers the last failed connection to a broker (dial, TLS
// or SASL), so a timeout can say why; a later success clears it.
type connErrors struct {
	last atomic.Pointer[connError]
	sasl bool // a login is configured: a connection closed after the dial may be a refused login
}

type connError struct {
	addr string
	err  error
	at   time.Time
}

// OnBrokerConnect implements kgo.HookBrokerConnect.
func (c *connErrors) OnBrokerConnect(meta kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	addr := net.JoinHostPort(meta.Host, strconv.Itoa(int(meta.Port)))
	if err != nil {
		c.last.Store(&connError{addr: addr, err: err, at: time.Now()})
		return
	}
	if l := c.last.Load(); l != nil && l.addr == addr {
		c.last.CompareAndSwap(l, nil)
	}
}

// since is "; last connection error: ..." for a failure since t, or "".
func (c *connErrors) since(t time.Time) string {
	l := c.last.Load()
	if l == nil || l.at.Before(t) {
		return ""
	}
	msg := fmt.Sprintf("; last connection error (broker %s): %v", l.addr, l.err)
	if c.sasl && !strings.HasPrefix(l.err.Error(), "unable to dial") {
		// Brokers close the connection on a failed login, some (kfake)
		// without saying why.
		msg += " (connected, then failed: check dispatch.kafka.sasl.*)"
	}
	return msg
}

// unacked counts the records handed to franz-go whose promise has not run,
// across batches: a batch that ended without all its answers leaves some.
type unacked struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed while n == 0
}

func newUnacked() *unacked {
	u := &unacked{idle: make(chan struct{})}
	close(u.idle)
	return u
}

func (u *unacked) add() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.n == 0 {
		u.idle = make(chan struct{})
	}
	u.n++
}

func (u *unacked) done() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.n--
	if u.n == 0 {
		close(u.idle)
	}
}

// wait reports whether every record was answered before ctx ended.
func (u *unacked) wait(ctx context.Context) bool {
	u.mu.Lock()
	idle := u.idle
	u.mu.Unlock()
	select {
	case <-idle:
		return true
	case <-ctx.Done():
		return false
	}
}

// logger passes franz-go's errors to slog; its warnings (each failed
// connection attempt while a broker is down) would repeat every second,
// and the failures reach last_error through the results anyway.
type logger struct{ l *slog.Logger }

func (logger) Level() kgo.LogLevel { return kgo.LogLevelError }

func (g logger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	if level == kgo.LogLevelError {
		g.l.Error("kafka client: "+msg, keyvals...)
	}
}
