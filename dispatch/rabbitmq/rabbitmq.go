// Package rabbitmq is the RabbitMQ sink: amqp091-go with publisher
// confirms, persistent messages, MessageId = outbox id, and mandatory
// publishing with returns matched by message id, so an unroutable message
// is a failure, never a success. It imports nothing of outboxd but
// dispatch.
//
// What it promises:
//
//   - An event is Delivered only when the broker confirmed it (basic.ack
//     in confirm mode) and did not return it first. RabbitMQ answers a
//     mandatory message no queue takes with basic.return and then acks it;
//     it sends the return before the ack on the channel, and amqp091-go
//     hands both over from its one reader goroutine in that order. Send
//     relies on that: it empties the returns buffer after it sees a
//     confirm and before it decides what the confirm means, so a return is
//     always seen before its ack could count as a delivery.
//   - One connection, one channel: the events of a batch go out in slice
//     order, so a queue holds an aggregate's events in batch order.
//   - A message the broker can never take for what it is (a header frame
//     above the negotiated frame_max, a routing key above 255 bytes, a
//     payload above a max_message_size learnt earlier) is refused before it
//     is published: Permanent for its event alone; the connection and the
//     other messages in flight are not touched.
//   - Nothing is published after the batch's trust deadline: Send checks
//     it before every publish, the connection refuses writes past it, and
//     a Send cut by it closes the connection (the next Send reconnects).
//
// What it does not: drop duplicates (consumers dedupe on message_id), or
// keep an aggregate's order across a retry: after a failure the broker may
// already hold the aggregate's later events, which are reported
// NotAttempted and sent again after the failed one.
package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxd/outboxd/dispatch"
)

// Defaults (docs/reference.md) for Config's zero fields.
const (
	DefaultURL        = "amqp://guest:guest@127.0.0.1:5672/"
	DefaultExchange   = "outbox" // a durable topic exchange, declared if missing
	DefaultRoutingKey = "outbox.event.{aggregate_type}"
)

// chunk is how many messages are in flight at most: a Send publishes a
// chunk, collects its confirms, then publishes the next. The returns
// buffer holds a chunk, so the connection's reader never waits on the sink
// with a return in hand (amqp091-go drops a notification nobody takes
// within 5 s, and a dropped return would make an unroutable message look
// delivered).
const chunk = 1000

// connectTimeout bounds a connection's dial, handshake and channel setup
// when the batch's deadline is later.
const connectTimeout = 10 * time.Second

// closeTimeout bounds the close handshake of a connection being replaced
// or closed.
const closeTimeout = 2 * time.Second

// maxShortString is AMQP's limit for exchange names and routing keys.
const maxShortString = 255

// Config configures the sink.
type Config struct {
	URL         string               // DefaultURL when empty
	Exchange    string               // DefaultExchange when empty
	RoutingKey  string               // template; DefaultRoutingKey when empty
	CloudEvents dispatch.CloudEvents // dispatch.AMQPBinding: cloudEvents_ headers
	Log         *slog.Logger         // optional
}

// Sink publishes batches to RabbitMQ. Create with New; Close when done.
type Sink struct {
	url      string
	target   string // the URL without credentials, for errors and logs
	exchange string
	key      dispatch.Template
	ce       dispatch.CloudEvents
	log      *slog.Logger
	now      func() time.Time // the publish loop's clock (tests move it)

	mu       sync.Mutex
	link     *link // nil until the first Send, and after a connection is dropped
	closed   bool
	setupErr string // the last setup failure logged: a lasting one is logged once
	maxSize  int    // the broker's max_message_size once it refused a message (0: unknown)
}

// New validates cfg and returns the sink. It does not wait for the broker:
// an unreachable broker makes sends fail (retryable), never New.
func New(cfg Config) (*Sink, error) {
	raw := cfg.URL
	if raw == "" {
		raw = DefaultURL
	}
	target, err := ParseURL(raw)
	if err != nil {
		return nil, err
	}
	exchange := cfg.Exchange
	if exchange == "" {
		exchange = DefaultExchange
	}
	if err := checkName("exchange", exchange); err != nil {
		return nil, err
	}
	tpl := cfg.RoutingKey
	if tpl == "" {
		tpl = DefaultRoutingKey
	}
	key, err := dispatch.ParseTemplate(tpl)
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: routing key: %w", err)
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Sink{url: raw, target: target, exchange: exchange, key: key, ce: cfg.CloudEvents, log: log, now: time.Now}, nil
}

// ParseURL checks an AMQP URL (dispatch.rabbitmq.url) and returns it
// without credentials, for display. Its errors never quote the URL, which
// may hold a password. New calls it; a config check may too.
func ParseURL(s string) (string, error) {
	u, err := amqp.ParseURI(s)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // it quotes the whole URL
		}
		return "", fmt.Errorf("rabbitmq: url: %w (want amqp://user:password@host:port/vhost, or amqps://; percent-encode reserved characters in the user name or password)", err)
	}
	vhost := u.Vhost
	if vhost == "/" {
		vhost = ""
	}
	return (&url.URL{Scheme: u.Scheme, Host: u.Host + ":" + strconv.Itoa(u.Port), Path: "/" + vhost}).String(), nil
}

// checkName refuses an exchange name the broker would refuse: an AMQP
// short string is at most 255 bytes, and control characters are no part
// of a name.
func checkName(what, s string) error {
	if err := checkShort(what, s); err != nil {
		return err
	}
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] == 0x7f {
			return fmt.Errorf("rabbitmq: %s %q holds a control character", what, s)
		}
	}
	return nil
}

// checkShort refuses what cannot be written as an AMQP short string (the
// library would fail the write and drop the connection).
func checkShort(what, s string) error {
	if len(s) > maxShortString {
		return fmt.Errorf("rabbitmq: %s %q is %d bytes, above AMQP's limit of %d", what, dispatch.Clip(s, 64), len(s), maxShortString)
	}
	return nil
}

// Capabilities implements dispatch.Sink.
func (s *Sink) Capabilities() dispatch.Capabilities {
	return dispatch.Capabilities{Ordering: "per queue (one channel, publish order)"}
}

// Send implements dispatch.Sink. It publishes the batch on one channel in
// order, up to a chunk of messages in flight, and waits for their confirms
// within the batch's trust deadline. An aggregate's successes are a
// prefix: after its first failure its later events are NotAttempted.
func (s *Sink) Send(ctx context.Context, b dispatch.Batch) []dispatch.Result {
	out := make([]dispatch.Result, len(b.Events))
	if len(out) == 0 {
		return out
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	start := time.Now()
	until := b.Until()
	ctx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	if ctx.Err() != nil || !s.now().Before(until) {
		return out // nothing sent: all NotAttempted
	}
	r := dispatch.NewRounds(b.Events)
	l, err := s.ready(ctx)
	if err != nil {
		s.setupFailed(err)
		res := dispatch.Failed(err)
		res.Cut = ctx.Err() != nil
		for _, i := range r.Next() {
			r.Set(i, res) // each aggregate's first event; the rest NotAttempted
		}
		return r.Results()
	}
	s.setupErr = ""
	t := &sending{s: s, l: l, ctx: ctx, until: until, b: b, r: r, returned: map[string]amqp.Return{}}
	t.run()
	out = r.Results()
	t.warnDropped()
	s.log.Debug("rabbitmq batch sent", "batch_size", len(out), "delivered", count(out, dispatch.Delivered),
		"failed", count(out, dispatch.Retryable)+count(out, dispatch.Permanent), "duration_ms", time.Since(start).Milliseconds())
	return out
}

// setupFailed logs a failure to connect or declare, once while it lasts.
func (s *Sink) setupFailed(err error) {
	if err.Error() == s.setupErr {
		return
	}
	s.setupErr = err.Error()
	if dispatch.IsPermanent(err) {
		s.log.Error("rabbitmq sink cannot publish: configuration error", "error", err)
		return
	}
	s.log.Warn("rabbitmq sink cannot publish", "error", err)
}

// Close disconnects. Sends after Close fail (retryable).
func (s *Sink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.link != nil {
		s.link.close()
		s.link = nil
	}
	return nil
}

func count(out []dispatch.Result, o dispatch.Outcome) int {
	n := 0
	for _, r := range out {
		if r.Outcome == o {
			n++
		}
	}
	return n
}

// sending is one Send's state.
type sending struct {
	s        *Sink
	l        *link
	ctx      context.Context
	until    time.Time
	b        dispatch.Batch
	r        *dispatch.Rounds       // results; an aggregate with a known failure publishes nothing more
	returned map[string]amqp.Return // returned messages by message id
	dropped  []string               // row header names left out, for one warning
	dropID   int64                  // the first event that had some
	dropN    int                    // how many events had some
}

// inflight is a published message waiting for its confirm.
type inflight struct {
	i  int
	rk string
	dc *amqp.DeferredConfirmation
}

// run publishes the batch chunk by chunk until it is done or cut.
func (t *sending) run() {
	// The deadline or the caller's context ending mid-send closes the
	// connection: a write blocked by a slow or blocked broker returns, and
	// nothing more leaves.
	stop := context.AfterFunc(t.ctx, t.l.abort)
	defer stop()
	t.l.raw.arm(t.until)
	defer t.l.raw.arm(time.Time{})
	for lo := 0; lo < len(t.b.Events); lo += chunk {
		fl, more := t.publish(lo, min(lo+chunk, len(t.b.Events)))
		if !t.confirm(fl) || !more {
			return
		}
	}
}

// publish sends events [lo, hi) and returns what went out; more is false
// when the rest of the batch must not be sent (deadline, channel gone).
func (t *sending) publish(lo, hi int) (fl []inflight, more bool) {
	for i := lo; i < hi; i++ {
		ev := t.b.Events[i]
		if t.r.Stopped(i) {
			continue // NotAttempted: an earlier event of its aggregate failed
		}
		if t.ctx.Err() != nil || !t.s.now().Before(t.until) {
			return fl, false // the rest stay NotAttempted
		}
		rk, err := t.s.key.Render(ev, dispatch.NameRules{Kind: dispatch.AMQPRoutingKey})
		if err != nil {
			t.fail(i, fmt.Errorf("rabbitmq: %w (dispatch.rabbitmq.routing_key filled from the row)", err))
			continue
		}
		if err := t.s.check(ev); err != nil {
			t.fail(i, err)
			continue
		}
		msg := t.message(ev)
		if err := checkFrame(ev, msg, t.l.conn.Config.FrameSize); err != nil {
			t.fail(i, err)
			continue
		}
		dc, err := t.l.ch.PublishWithDeferredConfirmWithContext(t.ctx, t.s.exchange, rk, true, false, msg)
		if err != nil {
			if t.ctx.Err() == nil {
				t.fail(i, t.s.publishError(ev, rk, err, t.l.closeReason()))
			}
			return fl, false
		}
		fl = append(fl, inflight{i: i, rk: rk, dc: dc})
		t.l.drainReturns(t.returned) // keep the buffer short while publishing
	}
	return fl, true
}

// message maps an event to an AMQP message (the contract's mapping).
func (t *sending) message(ev dispatch.Event) amqp.Publishing {
	m := dispatch.Encode(ev, t.b.Token, t.s.ce, dispatch.AMQPBinding)
	dropped := m.Dropped
	table := make(amqp.Table, len(m.Headers))
	for _, h := range m.Headers {
		if len(h.Key) > maxShortString {
			dropped = append(dropped, h.Key) // a table key is a short string
			continue
		}
		table[h.Key] = h.Value
	}
	t.noteDropped(ev.ID, dropped)
	return amqp.Publishing{
		Headers:      table,
		ContentType:  m.ContentType, // datacontenttype in binary mode (AMQP binding §3.1.1)
		DeliveryMode: amqp.Persistent,
		MessageId:    strconv.FormatInt(ev.ID, 10),
		Timestamp:    ev.CreatedAt,
		Type:         ev.EventType,
		Body:         m.Body,
	}
}

// confirm waits for the confirms of fl in publish order and records each
// outcome; false when the deadline or the context cut it short.
func (t *sending) confirm(fl []inflight) bool {
	for n, f := range fl {
		if !t.await(f.dc) {
			for _, g := range fl[n:] {
				t.settle(g)
			}
			// What the broker still owes this channel must not be mixed
			// up with a later batch's answers: start over next time.
			t.l.abort()
			return false
		}
		t.settle(f)
	}
	return true
}

// await waits for dc, taking returns as they come; false if the deadline
// or the context came first.
func (t *sending) await(dc *amqp.DeferredConfirmation) bool {
	for {
		select {
		case <-dc.Done():
			return true
		case r, ok := <-t.l.returns:
			if !ok {
				t.l.returns = nil // the channel closed; its confirms are all nacked
				continue
			}
			t.returned[r.MessageId] = r
		case <-t.ctx.Done():
			select {
			case <-dc.Done():
				return true
			default:
				return false
			}
		}
	}
}

// settle records the outcome of one published message.
func (t *sending) settle(f inflight) {
	// RabbitMQ sends a message's basic.return before its basic.ack, and
	// amqp091-go's reader goroutine puts the return in t.l.returns before
	// it marks the confirm done: once the confirm is done, its return (if
	// any) is in the buffer. Take everything buffered before deciding.
	t.l.drainReturns(t.returned)
	ev := t.b.Events[f.i]
	if r, ok := t.returned[strconv.FormatInt(ev.ID, 10)]; ok {
		t.fail(f.i, t.s.unroutable(ev, r))
		return
	}
	select {
	case <-f.dc.Done():
	default:
		t.cut(f.i, fmt.Errorf("rabbitmq: event %d: no confirm from the broker for exchange %q routing key %q before the deadline (a slow or blocked broker: see its resource alarms); it will be sent again", ev.ID, t.s.exchange, f.rk))
		return
	}
	if f.dc.Acked() {
		t.r.Set(f.i, dispatch.Result{Outcome: dispatch.Delivered, Ref: "delivery tag " + strconv.FormatUint(f.dc.DeliveryTag, 10)})
		return
	}
	if t.ctx.Err() != nil {
		// Cutting closed the connection, which nacks what is pending.
		t.cut(f.i, fmt.Errorf("rabbitmq: event %d: connection closed by the deadline before the broker confirmed it; it will be sent again", ev.ID))
		return
	}
	if reason := t.l.closeReason(); reason != nil {
		t.fail(f.i, t.s.closedError(ev, f.rk, reason))
		return
	}
	t.fail(f.i, t.s.nacked(ev, f.rk))
}

// fail records a failure for event i and stops its aggregate.
func (t *sending) fail(i int, err error) {
	t.r.Set(i, dispatch.Failed(err))
}

// cut records event i as unanswered when the deadline or context ended.
func (t *sending) cut(i int, err error) {
	t.r.Set(i, dispatch.Result{Outcome: dispatch.Retryable, Err: err, Cut: true})
}

// noteDropped remembers an event's row headers that were not sent.
func (t *sending) noteDropped(id int64, dropped []string) {
	if len(dropped) == 0 {
		return
	}
	if t.dropN == 0 {
		t.dropID = id
	}
	t.dropN++
	for _, d := range dropped {
		if d = dispatch.Clip(d, 64); !slices.Contains(t.dropped, d) {
			t.dropped = append(t.dropped, d)
		}
	}
}

// warnDropped logs, once per batch, the row headers that were not sent.
func (t *sending) warnDropped() {
	if t.dropN == 0 {
		return
	}
	slices.Sort(t.dropped)
	t.s.log.Warn("row headers not sent: the name collides with a contract header, or the name or value holds control characters",
		"outbox_id", t.dropID, "dropped", t.dropped, "events", t.dropN)
}

// check refuses, before publishing, what the broker would refuse for good
// and what AMQP cannot carry.
func (s *Sink) check(ev dispatch.Event) error {
	if err := checkShort("event_type (the type property)", ev.EventType); err != nil {
		return &dispatch.Error{Err: fmt.Errorf("rabbitmq: event %d: %w", ev.ID, err), Permanent: true}
	}
	if s.maxSize > 0 && len(ev.Payload) > s.maxSize {
		return tooLarge(ev, s.maxSize)
	}
	return nil
}
