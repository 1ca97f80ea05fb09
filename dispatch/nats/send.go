package nats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outboxd/dispatch"
)

// Send implements dispatch.Sink: the batch is published asynchronously in
// its order, then every PubAck is awaited, all bounded by the trust
// deadline taken at the start. Events not published when it passes are
// NotAttempted; events published but not acknowledged are Retryable, Cut.
func (s *Sink) Send(ctx context.Context, b dispatch.Batch) []dispatch.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := dispatch.NewRounds(b.Events)
	if len(b.Events) == 0 {
		return r.Results()
	}
	ctx, cancel, ok := b.Window(ctx)
	defer cancel()
	if !ok {
		return r.Results() // nothing sent: all NotAttempted
	}
	start := time.Now()
	nc, js, err := s.conn()
	if err != nil {
		failFirst(b.Events, r, err)
		return r.Results()
	}
	s.drainRefused() // left by an earlier batch that stopped waiting
	sent, drops := s.publish(ctx, nc, js, b, r)
	streams := s.await(ctx, sent, b.Events, r)
	out := r.Results()
	drops.Log(s.log, "row headers dropped: their names collide with the contract's headers, or NATS cannot carry them (see docs/sinks/nats.md)")
	s.askWindows(streams)
	if s.log.Enabled(ctx, slog.LevelDebug) {
		s.log.Debug("nats batch sent", "batch_size", len(b.Events), "published", len(sent),
			"duration_ms", time.Since(start).Milliseconds())
	}
	return out
}

// published is one message awaiting its PubAck.
type published struct {
	i       int // index in the batch
	subject string
	ack     jetstream.PubAckFuture
}

// publish sends the batch in order without waiting for acks. An aggregate
// stops at its first event that cannot be sent (its later ones stay
// NotAttempted and are never sent); a failure of the connection itself
// stops the batch.
func (s *Sink) publish(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, b dispatch.Batch, r *dispatch.Rounds) ([]published, dispatch.DroppedHeaders) {
	deadline, _ := ctx.Deadline()
	sent := make([]published, 0, len(b.Events))
	var drops dispatch.DroppedHeaders
	for i, ev := range b.Events {
		if r.Stopped(i) {
			continue
		}
		wait := time.Until(deadline)
		if ctx.Err() != nil || wait <= 0 {
			break // the rest stay NotAttempted
		}
		msg, dropped, err := s.message(ev, b.Token)
		drops.Add(ev.ID, dropped)
		if err != nil {
			r.Set(i, dispatch.Failed(err))
			continue
		}
		// No retries inside nats.go: a retried publish could land after the
		// aggregate's next one. Waiting for a free slot is bounded by the
		// deadline.
		f, err := js.PublishMsgAsync(msg, jetstream.WithRetryAttempts(0), jetstream.WithStallWait(wait))
		if err != nil {
			r.Stop(i)
			if errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
				break // the deadline came while waiting for a slot: not sent
			}
			r.Set(i, dispatch.Failed(s.publishError(nc, ev, msg, err)))
			if !perMessage(err) {
				break // the connection failed: the rest would fail alike
			}
			continue
		}
		sent = append(sent, published{i: i, subject: msg.Subject, ack: f})
	}
	return sent, drops
}

// await collects the PubAck (or error) of every published message, in
// order, until the deadline or ctx ends; it returns the streams named by
// the acks.
func (s *Sink) await(ctx context.Context, sent []published, events []dispatch.Event, r *dispatch.Rounds) map[string]bool {
	streams := map[string]bool{}
	refused := map[string]bool{}
	for _, p := range sent {
		ev := events[p.i]
		ack, err := s.awaitOne(ctx, p, refused)
		switch {
		case ack != nil:
			streams[ack.Stream] = true
			r.Set(p.i, acked(ack))
		case err != nil:
			r.Set(p.i, dispatch.Failed(s.ackError(ev, clipSubject(p.subject), err)))
		default:
			r.Set(p.i, dispatch.Result{Outcome: dispatch.Retryable, Cut: true,
				Err: fmt.Errorf("nats: event %d: no PubAck for subject %q before the send's deadline: %w", ev.ID, clipSubject(p.subject), context.Cause(ctx))})
		}
	}
	return streams
}

// awaitOne waits for p's answer: an ack, an error, or nothing (nil, nil)
// when the deadline or ctx ended first. An answer already there wins over
// an ended deadline.
func (s *Sink) awaitOne(ctx context.Context, p published, refused map[string]bool) (*jetstream.PubAck, error) {
	for {
		select {
		case ack := <-p.ack.Ok():
			return ack, nil
		case err := <-p.ack.Err():
			return nil, err
		default:
		}
		if refused[p.subject] {
			return nil, errPublishRefused
		}
		select {
		case ack := <-p.ack.Ok():
			return ack, nil
		case err := <-p.ack.Err():
			return nil, err
		case subj := <-s.refused:
			refused[subj] = true
		case <-ctx.Done():
			return nil, nil
		}
	}
}

// drainRefused forgets refusals reported after their Send stopped waiting.
func (s *Sink) drainRefused() {
	for {
		select {
		case <-s.refused:
		default:
			return
		}
	}
}

// errPublishRefused: the server's permissions refused the publish (it
// sends no ack then, only an asynchronous error).
var errPublishRefused = errors.New("the server refused the publish: permissions violation")

// acked is the result of a PubAck. A duplicate ack counts as delivered:
// the stream already stores a message with this Nats-Msg-Id, and that id
// is the event's DedupeID, which names the row (its id and fingerprint),
// so the message stored is this row's, sent before (a retry, a crash
// between the send and its mark), never another row's with the same id.
func acked(ack *jetstream.PubAck) dispatch.Result {
	r := dispatch.Result{Outcome: dispatch.Delivered, Ref: ack.Stream + "#" + strconv.FormatUint(ack.Sequence, 10)}
	if ack.Duplicate {
		r.Outcome = dispatch.Duplicate
	}
	return r
}

// message builds ev's NATS message: body = payload as is, the contract's
// headers (Headers) that NATS can carry, Nats-Msg-Id = ev.DedupeID()
// ("<id>:<fingerprint>").
func (s *Sink) message(ev dispatch.Event, token int64) (*nats.Msg, []string, error) {
	subj, err := s.subject.Render(ev, dispatch.NameRules{Kind: dispatch.NATSSubject})
	if err != nil {
		return nil, nil, fmt.Errorf("nats: %w: fix the row's aggregate_type/event_type or dispatch.nats.subject, then replay", err)
	}
	if err := checkSubject(subj); err != nil {
		return nil, nil, &dispatch.Error{Permanent: true,
			Err: fmt.Errorf("nats: event %d: %w: retrying cannot help; fix the row's aggregate_type/event_type or dispatch.nats.subject", ev.ID, err)}
	}
	m := dispatch.Encode(ev, token, s.ce, dispatch.NATSBinding)
	dropped := m.Dropped
	h := make(nats.Header, len(m.Headers)+1)
	for _, x := range m.Headers {
		if !carriable(x) {
			dropped = append(dropped, x.Key)
			continue
		}
		h[x.Key] = []string{x.Value}
	}
	h[jetstream.MsgIDHeader] = []string{ev.DedupeID()}
	msg := &nats.Msg{Subject: subj, Data: m.Body, Header: h}
	if err := checkHeaders(ev, msg); err != nil {
		return nil, dropped, err
	}
	return msg, dropped, nil
}

// carriable reports whether a row header can go on a NATS message as is:
// a name nats.go accepts (printable ASCII but "():;<=>?@[\]{}/,), none that
// the server or client read (Nats-*, which set dedupe ids, expectations,
// TTLs and rollups; Status and Description, which mark status messages),
// and no text "Nats-Msg-Id" in name or value: a 2.9 server looks the id up
// by its first occurrence in the header block and would miss ours.
func carriable(h dispatch.Header) bool {
	if h.Key == "" {
		return false
	}
	for i := 0; i < len(h.Key); i++ {
		c := h.Key[i]
		if c < 33 || c > 126 || strings.IndexByte(`"()/,:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	name := strings.ToLower(h.Key)
	if strings.HasPrefix(name, "nats-") || name == "status" || name == "description" {
		return false
	}
	return !strings.Contains(strings.ToLower(h.Value), "nats-msg-id")
}

// perMessage reports whether a publish error is about the message (the
// next one may go through), not the connection.
func perMessage(err error) bool {
	return errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, nats.ErrBadSubject) || errors.Is(err, nats.ErrBadHeaderMsg)
}

// publishError explains a publish nats.go refused before sending it.
func (s *Sink) publishError(nc *nats.Conn, ev dispatch.Event, msg *nats.Msg, err error) error {
	switch {
	case errors.Is(err, nats.ErrMaxPayload):
		size := msg.Size() - len(msg.Subject)
		return &dispatch.Error{Permanent: true, Err: fmt.Errorf(
			"nats: event %d to subject %q: message of %d bytes (payload %d plus headers) is above the server's max_payload of %d bytes: retrying cannot help; raise max_payload on the server or make the event smaller: %w",
			ev.ID, clipSubject(msg.Subject), size, len(msg.Data), nc.MaxPayload(), err)}
	case errors.Is(err, nats.ErrBadSubject), errors.Is(err, nats.ErrBadHeaderMsg):
		return &dispatch.Error{Permanent: true, Err: fmt.Errorf("nats: event %d to subject %q: the client refused the message (retrying cannot help): %w", ev.ID, clipSubject(msg.Subject), err)}
	case errors.Is(err, nats.ErrReconnectBufExceeded):
		return fmt.Errorf("nats: event %d to subject %q: not sent, the connection to %s is down (reconnecting): %w", ev.ID, clipSubject(msg.Subject), s.target, err)
	case errors.Is(err, nats.ErrHeadersNotSupported):
		return fmt.Errorf("nats: event %d: the server at %s does not support headers (NATS 2.2 or later is needed): %w", ev.ID, s.target, err)
	default:
		return fmt.Errorf("nats: event %d to subject %q: not sent: %w", ev.ID, clipSubject(msg.Subject), err)
	}
}

// ackError explains an error answer to a publish. Permanent only when the
// stream says the message is too large for it; everything else (no stream,
// a full stream, a lost connection) an operator or time can fix.
func (s *Sink) ackError(ev dispatch.Event, subj string, err error) error {
	var api *jetstream.APIError
	switch {
	case errors.Is(err, jetstream.ErrNoStreamResponse):
		return fmt.Errorf("nats: event %d: no JetStream stream captures subject %q (no responders): add the subject to a stream's subjects (or enable JetStream on the server): %w", ev.ID, subj, err)
	case errors.Is(err, errPublishRefused):
		return fmt.Errorf("nats: event %d: publish to subject %q refused by the server's permissions: allow this user to publish to it: %w", ev.ID, subj, err)
	case errors.As(err, &api) && api.ErrorCode == errCodeHeaderTooLarge:
		return &dispatch.Error{Permanent: true, Err: fmt.Errorf("nats: event %d: the stream for subject %q refused the message's headers as too large (%s): retrying cannot help; make the row's headers smaller: %w", ev.ID, subj, api.Description, err)}
	case errors.As(err, &api) && api.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum:
		return &dispatch.Error{Permanent: true, Err: fmt.Errorf("nats: event %d: the stream for subject %q refused the message as larger than its max_msg_size: retrying cannot help; raise the stream's max_msg_size or make the event smaller: %w", ev.ID, subj, err)}
	case errors.As(err, &api):
		hint := ""
		if strings.Contains(api.Description, "maximum messages") || strings.Contains(api.Description, "maximum bytes") {
			hint = " (the stream is full and discards new messages: raise its limits or let its consumers catch up)"
		}
		return fmt.Errorf("nats: event %d: the stream for subject %q refused the message: %s%s: %w", ev.ID, subj, api.Description, hint, err)
	case errors.Is(err, jetstream.ErrAsyncPublishTimeout):
		return fmt.Errorf("nats: event %d: no PubAck for subject %q within %s: %w", ev.ID, subj, ackTimeout, err)
	case errors.Is(err, nats.ErrDisconnected):
		return fmt.Errorf("nats: event %d: the connection was lost before the PubAck for subject %q came: %w", ev.ID, subj, err)
	case errors.Is(err, jetstream.ErrJetStreamPublisherClosed):
		return fmt.Errorf("nats: event %d: the connection was closed before the PubAck for subject %q came (last error: %v): %w", ev.ID, subj, s.lastError(), err)
	default:
		return fmt.Errorf("nats: event %d: publish to subject %q failed: %w", ev.ID, subj, err)
	}
}

// failFirst reports err for the first event of each aggregate (Retryable);
// the others stay NotAttempted.
func failFirst(events []dispatch.Event, r *dispatch.Rounds, err error) {
	for _, i := range r.Next() {
		r.Set(i, dispatch.Result{Outcome: dispatch.Retryable, Err: fmt.Errorf("event %d: %w", events[i].ID, err)})
	}
}

// clipSubject shortens a subject for an error text (a subject may be up to
// maxSubject bytes; last_error need not carry all of it).
func clipSubject(subj string) string { return dispatch.Clip(subj, 200) }
