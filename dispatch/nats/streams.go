package nats

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outboxd/dispatch"
)

// streamWindows remembers the duplicate window of each stream the sink's
// messages went to (named by their PubAcks), looked up once per stream.
// Send asks for lookups without waiting for them: run does them in the
// background.
type streamWindows struct {
	mu      sync.Mutex
	windows map[string]time.Duration // stream -> duplicate window
	asked   map[string]time.Time     // stream -> when a lookup may be asked (again)
}

func (w *streamWindows) init() {
	w.windows = map[string]time.Duration{}
	w.asked = map[string]time.Time{}
}

// min is the smallest window known; 0 before any.
func (w *streamWindows) min() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	var m time.Duration
	for _, d := range w.windows {
		if m == 0 || d < m {
			m = d
		}
	}
	return m
}

// want reports whether stream's window should be looked up now, and if so
// marks it asked, so a stream is asked once at a time.
func (w *streamWindows) want(stream string, now time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.windows[stream]; ok {
		return false
	}
	if at, ok := w.asked[stream]; ok && now.Before(at) {
		return false
	}
	w.asked[stream] = now.Add(lookupTimeout + lookupRetry) // until lookup answers
	return true
}

// failed lets stream be asked again after lookupRetry.
func (w *streamWindows) failed(stream string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.asked[stream] = time.Now().Add(lookupRetry)
}

func (w *streamWindows) set(stream string, window time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.windows[stream] = window
	delete(w.asked, stream)
}

// askWindows queues lookups for the streams in acks not known yet; a full
// queue drops the request (asked again after lookupRetry).
func (s *Sink) askWindows(streams map[string]bool) {
	now := time.Now()
	for name := range streams {
		if !s.streams.want(name, now) {
			continue
		}
		select {
		case s.lookups <- name:
		default:
			s.streams.failed(name)
		}
	}
}

// probe looks up the stream the template's sample subject goes to, so the
// daemon's start-up check sees its duplicate window. Nothing is cached
// when no stream captures it: the subjects of real rows may still be.
func (s *Sink) probe(ctx context.Context) {
	_, js, err := s.conn()
	if err != nil {
		s.log.Info("nats: not connected at start; the sink keeps connecting in the background (the streams' duplicate windows are learned at first use)",
			"error", err)
		return
	}
	subj := sampleSubject(s.subject)
	ctx, cancel := context.WithTimeout(ctx, startProbe)
	defer cancel()
	name, err := js.StreamNameBySubject(ctx, subj)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		if subj == s.subject.Expand(dispatch.Event{}) { // no placeholders: this is the subject
			s.log.Warn("nats: no JetStream stream captures the subject: publishes fail (and are retried) until one does; add the subject to a stream",
				"subject", subj)
		} else {
			s.log.Info("nats: no JetStream stream captures the template's sample subject; the subjects of real rows are checked at first publish",
				"subject", subj)
		}
		return
	case err != nil:
		s.log.Info("nats: could not look up the template's stream at start (a timeout: the account may not allow $JS.API.STREAM.NAMES); the duplicate windows are learned at first use",
			"subject", subj, "error", err)
		return
	}
	s.streams.want(name, time.Now())
	s.lookup(ctx, name)
}

// lookup reads stream's duplicate window and logs it once; a failure is
// logged and tried again after lookupRetry.
func (s *Sink) lookup(ctx context.Context, name string) {
	_, js, err := s.conn()
	if err != nil {
		s.streams.failed(name)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	defer cancel()
	st, err := js.Stream(ctx, name)
	if err != nil {
		s.streams.failed(name)
		if !errors.Is(ctx.Err(), context.Canceled) { // not the sink closing
			s.log.Info("nats: could not read the stream's duplicate window (the account may not allow STREAM.INFO); asked again later",
				"stream", name, "error", err)
		}
		return
	}
	window := st.CachedInfo().Config.Duplicates
	s.streams.set(name, window)
	switch {
	case !s.started.Load():
		// Found during New: the daemon compares Capabilities with its retry
		// horizon and warns itself.
		s.log.Info("nats: stream found", "stream", name, "dedupe_window", window.String())
	case window < s.warnAt:
		s.log.Warn("nats: the stream's duplicate window is shorter than the retry horizon: a retry after it is stored again (consumers must dedupe on the id header)",
			"stream", name, "dedupe_window", window.String(), "retry_horizon", s.warnAt.String())
	default:
		s.log.Info("nats: stream found", "stream", name, "dedupe_window", window.String())
	}
}
