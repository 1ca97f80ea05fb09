// Package nats is the NATS JetStream sink: nats.go's jetstream package,
// asynchronous publish of a batch with one acknowledgement (PubAck) per
// message, Nats-Msg-Id = "<outbox id>:<fingerprint>" (Event.DedupeID) for
// the stream's duplicate window: the same row sent twice is stored once,
// and a duplicate ack counts as delivered; a new row that reuses an id (a
// sequence rewind, a re-import) is never taken for a duplicate. A subject
// no stream captures is a failure. It imports nothing of outboxd but dispatch.
//
// What it promises: an event is Delivered (or Duplicate) only once a
// JetStream PubAck for it came back, naming the stream and sequence (the
// Result's Ref, "stream#sequence"); the events of a batch are published in
// its order on one connection, so a subject's stream stores one
// aggregate's events in order; per aggregate, successes are a prefix of
// the batch; nothing is published after the batch's trust deadline. A
// publish that no stream captures, a server that is down, a full stream:
// Retryable. A message above the server's max_payload or the stream's
// max_msg_size, a header block above JetStream's 64 KiB, or a subject that
// is not a valid NATS subject: Permanent; the payload and header limits are
// checked before publishing.
//
// What it does not: dedupe beyond the stream's duplicate window (a retry
// after it is stored again: consumers dedupe on the id header), or keep
// order across an aggregate's failure: when an event fails on the server
// (a full stream) after its aggregate's next event was already in flight
// and stored, the next one is reported NotAttempted and sent again later,
// so consumers can see it before the failed one (see docs/sinks/nats.md).
//
// New does not wait for the server (at most startProbe, to learn the
// stream's duplicate window); the connection is made in the background
// and re-made forever while the server is away.
package nats

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outboxd/dispatch"
)

// Defaults (docs/reference.md) for Config's zero fields.
const (
	DefaultURL     = "nats://127.0.0.1:4222"
	DefaultSubject = "outbox.event.{aggregate_type}"
	// DefaultWarnWindow is the duplicate window below which a stream found
	// at first use is logged at WARN when Config.RetryHorizon is 0: JetStream's
	// own default window.
	DefaultWarnWindow = 2 * time.Minute
)

// Tuning. Not config keys: what an operator tunes is the stream.
const (
	// startProbe bounds how long New waits for the connection and the
	// template's stream lookup, so the daemon's start-up check can see the
	// duplicate window. A server that refuses connections answers at once;
	// one that does not answer costs at most this.
	startProbe = time.Second
	// reconnectWait is the pause between reconnection attempts (with
	// nats.go's jitter); attempts never stop.
	reconnectWait = time.Second
	// pingInterval and maxPingsOut notice a dead TCP connection (no RST)
	// within about 30 s, so Send stops waiting on acks that cannot come.
	pingInterval = 10 * time.Second
	maxPingsOut  = 2
	// ackTimeout frees the slot of a publish whose ack never comes (a Send
	// cut by its deadline leaves such publishes behind).
	ackTimeout = 15 * time.Second
	// maxPending is how many publishes may await their ack at once; a batch
	// larger than this waits for slots, within its deadline.
	maxPending = 4000
	// flusherTimeout bounds one socket write. nats.go writes a full buffer
	// inside the publish call, which no context can stop: a server that
	// stops reading could otherwise hold Send past its deadline for
	// nats.go's default minute. A write stuck this long fails the
	// connection, which is then made again.
	flusherTimeout = 3 * time.Second
	// lookupTimeout bounds one stream-info request; lookupRetry is how
	// long a failed lookup waits before it is tried again.
	lookupTimeout = 5 * time.Second
	lookupRetry   = time.Minute
)

// Config configures the sink.
type Config struct {
	URL         string               // DefaultURL when empty; a comma-separated list of servers works too
	Subject     string               // template; DefaultSubject when empty
	CredsFile   string               // optional user credentials file (JWT and NKey seed)
	CloudEvents dispatch.CloudEvents // dispatch.NATSBinding: ce- headers, percent-encoded
	Log         *slog.Logger         // optional
	// RetryHorizon is how long the poller may keep retrying a row (its
	// retry horizon's maximum). A stream found after start whose duplicate
	// window is shorter is logged at WARN: a retry after the window is
	// stored twice. 0: DefaultWarnWindow.
	RetryHorizon time.Duration

	maxPending int // tests: fewer publishes awaiting acks than maxPending
}

// Sink publishes batches to JetStream. Create with New; Close when done.
type Sink struct {
	mu      sync.Mutex // one Send at a time
	subject dispatch.Template
	servers string // the configured URL, credentials and all: given to nats.go only
	target  string // the servers without credentials, for errors and logs
	ce      dispatch.CloudEvents
	log     *slog.Logger
	warnAt  time.Duration // a stream window below this is worth a WARN
	pending int           // maxPending, or a test's

	// The connection, made by run in the background; ready is closed once
	// the first attempt has returned. A connection the server closed for
	// good (not just lost) is replaced by run: connClosed tells it.
	ready      chan struct{}
	connMu     sync.RWMutex
	nc         *nats.Conn
	js         jetstream.JetStream
	connClosed chan struct{}

	probed   chan struct{} // closed once the start-up lookup is over
	started  atomic.Bool   // New has returned: windows found now are logged by us
	stop     context.CancelFunc
	done     chan struct{} // closed when run has returned
	lookups  chan string   // stream names to look up, from Send
	refused  chan string   // subjects the server refused to let us publish to
	streams  streamWindows
	closeMu  sync.Mutex
	isClosed bool
}

// errClosed answers a Send after Close.
var errClosed = errors.New("nats: sink is closed")

// New validates cfg and returns the sink. It does not wait for the server
// (beyond a short start-up probe): an unreachable server makes Send return
// Retryable results until it is back, and the connection is made again by
// itself. Only a Config that cannot work fails: a bad URL or template, an
// unreadable credentials file.
func New(cfg Config) (*Sink, error) {
	servers := cmp.Or(cfg.URL, DefaultURL)
	target, err := parseServers(servers)
	if err != nil {
		return nil, err
	}
	tpl, err := dispatch.ParseTemplate(cmp.Or(cfg.Subject, DefaultSubject))
	if err != nil {
		return nil, fmt.Errorf("nats: subject: %w", err)
	}
	if err := checkSubject(sampleSubject(tpl)); err != nil {
		return nil, fmt.Errorf("nats: subject template %q does not make a valid NATS subject: %w", cmp.Or(cfg.Subject, DefaultSubject), err)
	}
	if cfg.CredsFile != "" {
		if err := checkCreds(cfg.CredsFile); err != nil {
			return nil, err
		}
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, stop := context.WithCancel(context.Background())
	s := &Sink{
		subject: tpl, servers: servers, target: target, ce: cfg.CloudEvents, log: log,
		warnAt: cmp.Or(cfg.RetryHorizon, DefaultWarnWindow), pending: cmp.Or(cfg.maxPending, maxPending),
		ready: make(chan struct{}), probed: make(chan struct{}), stop: stop, done: make(chan struct{}),
		lookups: make(chan string, 16), refused: make(chan string, 64), connClosed: make(chan struct{}, 1),
	}
	s.streams.init()
	go s.run(ctx, s.options(cfg.CredsFile))
	select {
	case <-s.probed:
	case <-time.After(startProbe):
		if _, _, err := s.conn(); err != nil { // connected: the probe logs why its lookup is slow
			log.Info("nats: no answer from the server within the start-up probe; the sink keeps connecting in the background (the streams' duplicate windows are learned at first use)",
				"servers", target, "probe", startProbe.String())
		}
	}
	s.started.Store(true)
	return s, nil
}

// options are the connection's: reconnect forever (also after a failed
// first connection and after authorization errors, which an operator can
// fix), no reconnect buffer (a publish while disconnected fails at once
// instead of being sent later, after its Send has reported it failed).
func (s *Sink) options(credsFile string) []nats.Option {
	opts := []nats.Option{
		nats.Name("outboxd"),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(reconnectWait),
		nats.ReconnectBufSize(-1),
		nats.IgnoreAuthErrorAbort(),
		nats.PingInterval(pingInterval),
		nats.FlusherTimeout(flusherTimeout),
		nats.MaxPingsOutstanding(maxPingsOut),
		nats.ErrorHandler(s.asyncError),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				s.log.Warn("nats: disconnected; reconnecting", "servers", s.target, "error", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			s.log.Info("nats: reconnected", "server", nc.ConnectedUrlRedacted())
		}),
		nats.ClosedHandler(s.connectionClosed),
	}
	if credsFile != "" {
		opts = append(opts, nats.UserCredentials(credsFile))
	}
	return opts
}

// run connects, looks up the template's stream, then serves stream
// lookups for Send and replaces a closed connection until ctx ends.
func (s *Sink) run(ctx context.Context, opts []nats.Option) {
	defer close(s.done)
	s.connect(opts)
	close(s.ready)
	if ctx.Err() == nil { // not closed while connecting
		s.probe(ctx)
	}
	close(s.probed)
	for {
		select {
		case <-ctx.Done():
			return
		case name := <-s.lookups:
			s.lookup(ctx, name)
		case <-s.connClosed:
			// Not the sink's Close (ctx would be done): the server closed
			// the connection for good, which nats.go does not recover
			// from (e.g. an -ERR it does not know). Pause, so a server that
			// keeps doing it is not hammered, then start over.
			s.log.Warn("nats: the connection was closed; making a new one", "servers", s.target, "error", s.lastError())
			select {
			case <-ctx.Done():
				return
			case <-time.After(reconnectWait):
			}
			s.connect(opts)
		}
	}
}

// connect makes a connection and makes it the sink's. With
// RetryOnFailedConnect, nats.Connect fails only on options it cannot use;
// the sink then answers every Send with that error.
func (s *Sink) connect(opts []nats.Option) {
	nc, err := nats.Connect(s.servers, opts...)
	if err != nil {
		s.log.Error("nats: cannot connect", "servers", s.target, "error", err)
		return
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(s.pending), jetstream.WithPublishAsyncTimeout(ackTimeout))
	if err != nil {
		nc.Close()
		s.log.Error("nats: cannot use JetStream", "servers", s.target, "error", err)
		return
	}
	s.connMu.Lock()
	s.nc, s.js = nc, js
	s.connMu.Unlock()
}

// current is the connection, nil before the first is made.
func (s *Sink) current() (*nats.Conn, jetstream.JetStream) {
	s.connMu.RLock()
	defer s.connMu.RUnlock()
	return s.nc, s.js
}

func (s *Sink) lastError() error {
	if nc, _ := s.current(); nc != nil {
		return nc.LastError()
	}
	return nil
}

// connectionClosed runs when a connection reaches CLOSED (nats.go's
// ClosedHandler): its publishes still awaiting a PubAck fail now rather
// than at their ack timeout, and run is told to make a new connection.
func (s *Sink) connectionClosed(closed *nats.Conn) {
	nc, js := s.current()
	if nc != closed {
		return
	}
	js.CleanupPublisher()
	select {
	case s.connClosed <- struct{}{}:
	default:
	}
}

// conn returns the connection once it is made, or why there is none.
func (s *Sink) conn() (*nats.Conn, jetstream.JetStream, error) {
	s.closeMu.Lock()
	closed := s.isClosed
	s.closeMu.Unlock()
	if closed {
		return nil, nil, errClosed
	}
	select {
	case <-s.ready:
	default:
		return nil, nil, fmt.Errorf("nats: still connecting to %s", s.target)
	}
	nc, js := s.current()
	if nc == nil {
		return nil, nil, fmt.Errorf("nats: no connection to %s (see the sink's error at start)", s.target)
	}
	if st := nc.Status(); st != nats.CONNECTED {
		msg := fmt.Sprintf("nats: not connected to %s (%s)", s.target, strings.ToLower(st.String()))
		if err := nc.LastError(); err != nil {
			return nil, nil, fmt.Errorf("%s: last error: %w", msg, err)
		}
		return nil, nil, errors.New(msg + ": is the server up and reachable?")
	}
	return nc, js, nil
}

// asyncError receives the connection's asynchronous errors. A publish the
// server's permissions refuse gets no ack, only this error: its subject is
// passed to the Send waiting for it.
func (s *Sink) asyncError(_ *nats.Conn, sub *nats.Subscription, err error) {
	if subj, ok := refusedSubject(err); ok && sub == nil {
		if strings.HasPrefix(subj, "$JS.API.") {
			return // a stream lookup: it times out and logs that it could not
		}
		select {
		case s.refused <- subj:
		default: // a Send not waiting: its deadline ends the wait instead
		}
		return
	}
	s.log.Warn("nats: asynchronous error", "servers", s.target, "error", err)
}

// refusedSubject reads the subject of a publish permissions violation:
// `nats: permissions violation: Permissions Violation for Publish to "x"`.
func refusedSubject(err error) (string, bool) {
	if !errors.Is(err, nats.ErrPermissionViolation) {
		return "", false
	}
	_, rest, ok := strings.Cut(err.Error(), `Publish to "`)
	if !ok {
		return "", false
	}
	subj, _, ok := strings.Cut(rest, `"`)
	return subj, ok
}

// Capabilities implements dispatch.Sink. MaxBatch 0: the poller bounds
// batches in rows and bytes, and publishes beyond maxPending wait for
// slots. DedupeWindow: the smallest duplicate window of the streams seen so
// far (the template's at start when the server answered; 0 before any).
func (s *Sink) Capabilities() dispatch.Capabilities {
	return dispatch.Capabilities{DedupeWindow: s.streams.min(), Ordering: "per subject (one stream)"}
}

// Close stops the background work and closes the connection; safe after a
// failed connection and more than once.
func (s *Sink) Close() error {
	s.closeMu.Lock()
	if s.isClosed {
		s.closeMu.Unlock()
		return nil
	}
	s.isClosed = true
	s.closeMu.Unlock()
	s.stop()
	<-s.done // run returns once nats.Connect has (bounded by its dial timeout)
	if nc, js := s.current(); nc != nil {
		js.CleanupPublisher()
		nc.Close()
	}
	return nil
}

// parseServers checks the URL list as nats.go reads it (comma-separated;
// nats://, tls://, ws:// or wss://; scheme optional) and returns it without
// credentials. Its errors never quote a URL, which may hold a password.
func parseServers(servers string) (string, error) {
	var shown []string
	for i, raw := range strings.Split(servers, ",") {
		raw = strings.TrimSpace(raw)
		if raw == "" {
			continue
		}
		if !strings.Contains(raw, "://") {
			raw = "nats://" + raw
		}
		u, err := url.Parse(raw)
		if err != nil {
			return "", fmt.Errorf("nats: url (server %d of the list) cannot be parsed as a URL (percent-encode reserved characters in a user name or password)", i+1)
		}
		switch u.Scheme {
		case "nats", "tls", "ws", "wss":
		default:
			return "", fmt.Errorf("nats: url (server %d of the list): want scheme nats, tls, ws or wss, got %q", i+1, u.Scheme)
		}
		if u.Hostname() == "" {
			return "", fmt.Errorf("nats: url (server %d of the list) has no host", i+1)
		}
		shown = append(shown, u.Scheme+"://"+u.Host)
	}
	if len(shown) == 0 {
		return "", errors.New("nats: url is empty")
	}
	return strings.Join(shown, ","), nil
}

// checkCreds reads a credentials file enough to tell it is one; nats.go
// reads it again at each connection, so a rotated file is picked up.
func checkCreds(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("nats: creds_file: %w", err)
	}
	text := string(b)
	if !strings.Contains(text, "-----BEGIN NATS USER JWT-----") || !strings.Contains(text, "SEED-----") {
		return fmt.Errorf("nats: creds_file %s is not a NATS credentials file (want a user JWT and an NKey seed, as `nsc generate creds` writes)", path)
	}
	return nil
}

// sampleSubject is the template with every placeholder filled by "x", to
// check its shape and find the stream it would go to.
func sampleSubject(t dispatch.Template) string {
	return t.Expand(dispatch.Event{AggregateType: "x", EventType: "x"})
}

// maxSubject bounds a subject's length. The publish's protocol line
// (subject, reply subject, sizes) must fit the server's max_control_line,
// 4 KiB by default; a longer one makes the server close the connection,
// which would cut every other aggregate's publishes with it.
const maxSubject = 4000

// checkSubject accepts a subject JetStream can store a message under:
// dot-separated non-empty tokens, no whitespace or control characters, no
// wildcard tokens (* and >), which a publish may not use, and not longer
// than maxSubject.
func checkSubject(subj string) error {
	if subj == "" {
		return errors.New("the subject is empty")
	}
	if len(subj) > maxSubject {
		return fmt.Errorf("subject %q is %d bytes long, above the %d a publish can carry (the server's max_control_line is 4 KiB by default)", clipSubject(subj), len(subj), maxSubject)
	}
	for i := 0; i < len(subj); i++ {
		if c := subj[i]; c <= ' ' || c == 0x7f {
			return fmt.Errorf("subject %q contains whitespace or a control character", subj)
		}
	}
	for tok := range strings.SplitSeq(subj, ".") {
		switch tok {
		case "":
			return fmt.Errorf("subject %q has an empty token (a leading, trailing or double dot; is a placeholder's value empty?)", subj)
		case "*", ">":
			return fmt.Errorf("subject %q contains the wildcard %q, which a published message cannot have", subj, tok)
		}
	}
	return nil
}
