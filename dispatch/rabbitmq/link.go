package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxd/outboxd/dispatch"
)

// link is one connection and its one channel in confirm mode. The sink
// keeps it between sends; one that closed is replaced at the next send.
type link struct {
	raw        *guardConn
	conn       *amqp.Connection
	connClosed chan *amqp.Error
	ch         *amqp.Channel
	chClosed   chan *amqp.Error
	returns    chan amqp.Return // returned (unroutable) messages; nil once closed
	reason     *amqp.Error      // why the channel closed, once read
	up         bool             // the channel is set up (confirm mode, exchange declared)
	aborted    atomic.Bool      // abort closed the socket (the library may not have noticed yet)
}

// ready returns a link with a channel set up, dialling or opening a
// channel as needed, within connectTimeout and ctx.
func (s *Sink) ready(ctx context.Context) (*link, error) {
	if s.closed {
		return nil, errors.New("rabbitmq: the sink is closed")
	}
	l := s.link
	if l != nil && l.usable() {
		return l, nil
	}
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	switch {
	case l != nil && l.connOpen():
		if l.up {
			s.log.Warn("rabbitmq channel closed; opening another", "error", describe(l.closeReason()))
		}
	default:
		switch {
		case l == nil:
		case l.aborted.Load():
			s.log.Info("rabbitmq reconnecting: the last connection was dropped when a send or its setup ran past the deadline")
		default:
			s.log.Warn("rabbitmq connection lost; reconnecting", "error", describe(l.connReason()))
		}
		if l != nil {
			l.close()
			s.link = nil
		}
		var err error
		if l, err = s.dial(ctx); err != nil {
			return nil, err
		}
		s.link = l
		s.log.Info("rabbitmq connected", "broker", s.target, "exchange", s.exchange)
	}
	// Channel RPCs wait for the broker without a timeout of their own:
	// ending ctx closes the connection, which ends them.
	stop := context.AfterFunc(ctx, l.abort)
	defer stop()
	if err := s.setup(l); err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("rabbitmq: set up a channel on %s: no answer in time (%w): %w", s.target, context.Cause(ctx), err)
		}
		return nil, err
	}
	return l, nil
}

// usable: connection and channel open and set up.
func (l *link) usable() bool {
	return l.up && l.connOpen() && !l.ch.IsClosed()
}

// connOpen: the connection is open, and not aborted.
func (l *link) connOpen() bool {
	return !l.aborted.Load() && !l.conn.IsClosed()
}

// dial connects to the broker. The dial and the AMQP handshake are
// bounded by ctx's deadline.
func (s *Sink) dial(ctx context.Context) (*link, error) {
	var raw *guardConn
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("outboxd")
	cfg := amqp.Config{Properties: props, Dial: func(network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{KeepAlive: 30 * time.Second}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		// Heartbeats start only after the handshake: bound it by ctx
		// (amqp091-go clears the deadline once the connection is open).
		if d, ok := ctx.Deadline(); ok {
			_ = c.SetDeadline(d)
		}
		raw = &guardConn{Conn: c}
		return raw, nil
	}}
	conn, err := amqp.DialConfig(s.url, cfg)
	if err != nil {
		if raw != nil {
			_ = raw.Close() // a failed handshake may leave the library's reader on it
		}
		return nil, fmt.Errorf("rabbitmq: connect to %s: %w (is the broker up, and are dispatch.rabbitmq.url's host, credentials and vhost right?)", s.target, err)
	}
	return &link{raw: raw, conn: conn, connClosed: conn.NotifyClose(make(chan *amqp.Error, 1))}, nil
}

// setup opens a channel in confirm mode and makes sure the exchange
// exists as a durable topic exchange.
func (s *Sink) setup(l *link) error {
	if err := l.openChannel(); err != nil {
		return fmt.Errorf("rabbitmq: open a channel on %s: %w", s.target, err)
	}
	if strings.HasPrefix(s.exchange, "amq.") {
		return s.declarePassive(l) // the broker's own exchanges: never declared by clients
	}
	err := l.ch.ExchangeDeclare(s.exchange, amqp.ExchangeTopic, true, false, false, false, nil)
	if err == nil {
		l.up = true
		return nil
	}
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Server {
		switch ae.Code {
		case amqp.PreconditionFailed:
			return &dispatch.Error{Permanent: true, Err: fmt.Errorf(
				"rabbitmq: exchange %q on %s exists but is not a durable topic exchange (%s): outboxd publishes to a durable topic exchange; point dispatch.rabbitmq.exchange at one, or delete this exchange so outboxd declares it",
				s.exchange, s.target, ae.Reason)}
		case amqp.AccessRefused:
			// No configure permission: the operator may have declared it.
			// The refusal closed the channel; check on a new one.
			if err := l.openChannel(); err != nil {
				return fmt.Errorf("rabbitmq: open a channel on %s: %w", s.target, err)
			}
			return s.declarePassive(l)
		}
	}
	return fmt.Errorf("rabbitmq: declare exchange %q on %s: %w", s.exchange, s.target, err)
}

// declarePassive checks that the exchange exists, without declaring it.
func (s *Sink) declarePassive(l *link) error {
	err := l.ch.ExchangeDeclarePassive(s.exchange, amqp.ExchangeTopic, true, false, false, false, nil)
	if err == nil {
		l.up = true
		return nil
	}
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Server {
		switch ae.Code {
		case amqp.NotFound:
			return fmt.Errorf("rabbitmq: exchange %q does not exist on %s and this user may not declare it (%s): create it as a durable topic exchange, or grant the user configure permission on it",
				s.exchange, s.target, ae.Reason)
		case amqp.AccessRefused:
			return &dispatch.Error{Permanent: true, Err: fmt.Errorf("rabbitmq: the broker refuses this user exchange %q on %s (%s): grant it write permission (and configure, to let outboxd declare it)",
				s.exchange, s.target, ae.Reason)}
		}
	}
	return fmt.Errorf("rabbitmq: check exchange %q on %s: %w", s.exchange, s.target, err)
}

// openChannel opens a channel in confirm mode, with its close and return
// notifications.
func (l *link) openChannel() error {
	l.up = false
	if l.ch != nil && !l.ch.IsClosed() {
		_ = l.ch.Close()
	}
	ch, err := l.conn.Channel()
	if err != nil {
		return err
	}
	l.ch, l.reason = ch, nil
	l.chClosed = ch.NotifyClose(make(chan *amqp.Error, 1))
	// A chunk's worth: see chunk.
	l.returns = ch.NotifyReturn(make(chan amqp.Return, chunk))
	return ch.Confirm(false)
}

// drainReturns moves the returns already received into m, by message id.
func (l *link) drainReturns(m map[string]amqp.Return) {
	for {
		select {
		case r, ok := <-l.returns:
			if !ok {
				l.returns = nil
				return
			}
			m[r.MessageId] = r
		default:
			return
		}
	}
}

// closeReason says why the channel closed; nil while it is open.
func (l *link) closeReason() *amqp.Error {
	if l.reason == nil {
		select {
		case e, ok := <-l.chClosed:
			if ok && e != nil {
				l.reason = e
			}
		default:
		}
	}
	if l.reason == nil && (l.ch == nil || l.ch.IsClosed()) {
		return amqp.ErrClosed
	}
	return l.reason
}

// connReason says why the connection closed, if it told.
func (l *link) connReason() *amqp.Error {
	select {
	case e, ok := <-l.connClosed:
		if ok && e != nil {
			return e
		}
	default:
	}
	return l.closeReason()
}

// abort drops the connection at once (a cut send, an RPC past its
// deadline). The library's reader sees the close and nacks what is pending.
func (l *link) abort() {
	l.aborted.Store(true)
	_ = l.raw.Close()
}

// close says goodbye to the broker, briefly, then drops the connection.
func (l *link) close() {
	_ = l.conn.CloseDeadline(time.Now().Add(closeTimeout))
	_ = l.raw.Close()
}

func describe(e *amqp.Error) string {
	if e == nil {
		return "closed"
	}
	return e.Error()
}

// errDeadlinePassed: a write refused because the send's deadline passed.
var errDeadlinePassed = errors.New("rabbitmq: the batch's deadline passed before these bytes were written")

// guardConn refuses writes once the current send's deadline has passed.
// The check sits right before the write syscall: a sender frozen (GC,
// SIGSTOP) after deciding to publish cannot put an expired holder's
// message on the wire when it resumes. A refused write fails the
// connection, which is replaced at the next send.
type guardConn struct {
	net.Conn
	until atomic.Int64 // unix nanoseconds; 0 = none
}

func (c *guardConn) Write(p []byte) (int, error) {
	if u := c.until.Load(); u != 0 && time.Now().UnixNano() >= u {
		return 0, errDeadlinePassed
	}
	return c.Conn.Write(p)
}

// arm makes writes past until fail; the zero time disarms.
func (c *guardConn) arm(until time.Time) {
	if until.IsZero() {
		c.until.Store(0)
		return
	}
	c.until.Store(until.UnixNano())
}
