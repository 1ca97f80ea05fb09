package dispatch

import (
	"cmp"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Template is a destination name (topic, subject, routing key, stream) with
// placeholders replaced by the row's values: {aggregate_type} and
// {event_type}. Debezium's outbox router default is
// "outbox.event.{aggregate_type}".
type Template struct {
	parts []string // literal, placeholder, literal, ... (placeholders at odd indexes)
}

// placeholders are the names a Template may use.
var placeholders = []string{"aggregate_type", "event_type"}

// ParseTemplate reads s; an unknown or unclosed placeholder is an error.
func ParseTemplate(s string) (Template, error) {
	if s == "" {
		return Template{}, fmt.Errorf("dispatch: empty destination template")
	}
	var t Template
	rest := s
	for {
		open := strings.IndexByte(rest, '{')
		if open < 0 {
			t.parts = append(t.parts, rest)
			return t, nil
		}
		end := strings.IndexByte(rest[open:], '}')
		if end < 0 {
			return Template{}, fmt.Errorf("dispatch: template %q: unclosed {", s)
		}
		name := rest[open+1 : open+end]
		if !slices.Contains(placeholders, name) {
			return Template{}, fmt.Errorf("dispatch: template %q: unknown placeholder {%s} (want {aggregate_type} or {event_type})", s, name)
		}
		t.parts = append(t.parts, rest[:open], name)
		rest = rest[open+end+1:]
	}
}

// Expand fills the placeholders from ev.
func (t Template) Expand(ev Event) string {
	if len(t.parts) == 1 {
		return t.parts[0]
	}
	var b strings.Builder
	for i, p := range t.parts {
		switch {
		case i%2 == 0:
			b.WriteString(p)
		case p == "aggregate_type":
			b.WriteString(ev.AggregateType)
		default:
			b.WriteString(ev.EventType)
		}
	}
	return b.String()
}

// Header is one message header (Kafka record header, NATS header, AMQP
// table entry, Redis stream field).
type Header struct{ Key, Value string }

// HeaderResentFrom is the entry of a resent copy's headers object (outboxd
// resend): the id of the delivered row it copies. Broker sinks pass it on
// as any entry of the row's headers; the webhook sends it as
// Outbox-Resent-From.
const HeaderResentFrom = "outbox-resent-from"

// Header names every broker message carries (docs/reference.md, "Headers per sink").
const (
	HeaderID            = "id"
	HeaderAggregateType = "aggregate_type"
	HeaderAggregateID   = "aggregate_id" // also the ordering key
	HeaderEventType     = "event_type"
	HeaderCreatedAt     = "created_at" // RFC 3339
	HeaderFencingToken  = "fencing_token"
)

// Headers returns a message's headers in the contract's order with
// binary-mode CloudEvents attributes under cePrefix (when enabled): see
// Encode, which sinks that support structured mode use instead. Kept for
// sinks that know only binary mode: ce.Mode is ignored here.
func Headers(ev Event, token int64, ce CloudEvents, cePrefix string) (hs []Header, dropped []string) {
	ce.Mode = CloudEventsBinary
	m := Encode(ev, token, ce, Binding{Prefix: cePrefix})
	return m.Headers, m.Dropped
}

// Message is an event as one protocol binding carries it.
type Message struct {
	// Headers in the contract's order: id, aggregate_type, aggregate_id,
	// event_type, created_at, fencing_token; then each entry of the row's
	// headers object (string values as they are, other JSON values as their
	// JSON text; an entry whose value is JSON null is left out: it carries
	// no value) whose name collides with none of the others (compared
	// case-insensitively) and which a header can carry; then the
	// CloudEvents headers, when enabled (Binding).
	Headers []Header
	// Body is the payload JSON as is, or in structured mode the CloudEvent
	// in the JSON event format.
	Body []byte
	// ContentType is Body's media type: MediaTypeJSON, or
	// MediaTypeCloudEventsJSON in structured mode. A sink whose protocol
	// has a content-type property of its own (AMQP, HTTP) sets it from this.
	ContentType string
	// Dropped names the row's header entries left out, for a warning.
	Dropped []string
}

// Encode maps ev to a message of binding b. With CloudEvents off the body
// is the payload and the headers are the contract's and the row's.
func Encode(ev Event, token int64, ce CloudEvents, b Binding) Message {
	created := ev.CreatedAt.UTC().Format(time.RFC3339Nano)
	hs := []Header{
		{HeaderID, strconv.FormatInt(ev.ID, 10)},
		{HeaderAggregateType, ev.AggregateType},
		{HeaderAggregateID, ev.AggregateID},
		{HeaderEventType, ev.EventType},
		{HeaderCreatedAt, created},
		{HeaderFencingToken, strconv.FormatInt(token, 10)},
	}
	m := Message{Body: ev.Payload, ContentType: MediaTypeJSON}
	var ceHeaders []Header
	switch {
	case !ce.Enabled:
	case ce.Mode == CloudEventsStructured:
		m.Body, m.ContentType = ce.Structured(ev), MediaTypeCloudEventsJSON
		if name := cmp.Or(b.ContentTypeHeader, b.FormatHeader); name != "" {
			ceHeaders = []Header{{name, MediaTypeCloudEventsJSON}}
		}
	default:
		ceHeaders = ce.Binary(ev, b)
	}
	taken := func(name string) bool {
		return slices.ContainsFunc(hs, func(h Header) bool { return strings.EqualFold(h.Key, name) }) ||
			slices.ContainsFunc(ceHeaders, func(h Header) bool { return strings.EqualFold(h.Key, name) })
	}
	var row map[string]json.RawMessage
	if json.Unmarshal(ev.Headers, &row) == nil {
		names := make([]string, 0, len(row))
		for k := range row {
			names = append(names, k)
		}
		slices.Sort(names) // a stable order, whatever Go's map did
		for _, k := range names {
			if string(row[k]) == "null" {
				continue // no value: no header (not "" or "null"), and nothing lost to warn about
			}
			v := headerValue(row[k])
			if k == "" || taken(k) || !HeaderSafe(k) || !HeaderSafe(v) {
				m.Dropped = append(m.Dropped, k)
				continue
			}
			hs = append(hs, Header{k, v})
		}
	}
	m.Headers = append(hs, ceHeaders...)
	return m
}

// headerValue is a JSON string's text, or any other JSON value as written.
func headerValue(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return string(raw)
}

// HeaderSafe reports whether s is free of control characters, which
// protocols refuse or split on (NATS headers are lines: a CR/LF would
// inject another header).
func HeaderSafe(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] == 0x7f {
			return false
		}
	}
	return true
}

// DroppedHeaders gathers, over a batch, the row headers a sink left out of
// its messages (Headers' dropped, and any the protocol refuses), so the
// batch gets one warning, not one per message.
type DroppedHeaders struct {
	firstID int64
	first   []string
	more    int
}

// Add records the names dropped from event id's message.
func (d *DroppedHeaders) Add(id int64, names []string) {
	switch {
	case len(names) == 0:
	case d.first == nil:
		d.firstID, d.first = id, names
	default:
		d.more++
	}
}

// Log warns once, with msg, naming the first event's dropped headers and
// how many other events lost some.
func (d *DroppedHeaders) Log(l *slog.Logger, msg string) {
	if d.first == nil {
		return
	}
	l.Warn(msg, "outbox_id", d.firstID, "dropped", d.first, "other_events_with_dropped_headers", d.more)
}
