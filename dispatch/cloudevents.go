package dispatch

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// CloudEvents maps every message to a CloudEvent (dispatch.cloudevents,
// dispatch.cloudevents_mode, dispatch.cloudevents_source): specversion 1.0,
// id = the outbox id, source, type = event_type, time = created_at,
// datacontenttype application/json, data = the payload, and the extension
// attributes aggregatetype and aggregateid (CloudEvents attribute names
// allow only a-z and 0-9).
type CloudEvents struct {
	Enabled bool
	Source  string // "source" attribute; DefaultCloudEventsSource when empty
	Mode    string // CloudEventsBinary (also when empty) or CloudEventsStructured
}

const (
	// DefaultCloudEventsSource is the "source" attribute when none is set.
	DefaultCloudEventsSource = "outboxd"
	// CloudEventsBinary puts the attributes in headers, the payload in the
	// body (dispatch.cloudevents_mode's default).
	CloudEventsBinary = "binary"
	// CloudEventsStructured sends the whole event, attributes and data, as
	// the body in the JSON event format.
	CloudEventsStructured = "structured"

	MediaTypeJSON            = "application/json"
	MediaTypeCloudEventsJSON = "application/cloudevents+json"
)

// CheckCloudEventsMode checks a dispatch.cloudevents_mode value.
func CheckCloudEventsMode(mode string) error {
	if mode != CloudEventsBinary && mode != CloudEventsStructured {
		return fmt.Errorf("want %s or %s, got %q", CloudEventsBinary, CloudEventsStructured, mode)
	}
	return nil
}

// Binding is how one protocol carries a CloudEvent, as its CloudEvents
// protocol binding defines it.
type Binding struct {
	// Prefix goes before each attribute's name in binary mode.
	Prefix string
	// PercentEncode: attribute values are percent-encoded (HTTP and NATS
	// bindings §3.1.3.2: space, '"', '%' and every byte outside printable
	// ASCII), so any text fits a header line.
	PercentEncode bool
	// ContentTypeHeader names the header carrying the body's media type in
	// both modes: datacontenttype in binary mode, the event format in
	// structured mode (Kafka's content-type).
	ContentTypeHeader string
	// FormatHeader names the header that marks structured mode with the
	// event format's media type; in binary mode datacontenttype is then an
	// attribute under Prefix like the others (NATS).
	//
	// With neither header set, the protocol has a content-type property of
	// its own, which the sink sets from Message.ContentType (HTTP, AMQP).
	FormatHeader string
}

// The bindings of the sinks (docs/sinks/*.md, "CloudEvents").
var (
	// HTTPBinding: HTTP protocol binding, ce- headers, Content-Type.
	HTTPBinding = Binding{Prefix: "ce-", PercentEncode: true}
	// KafkaBinding: Kafka protocol binding §3.2.3, ce_ headers, content-type.
	KafkaBinding = Binding{Prefix: "ce_", ContentTypeHeader: "content-type"}
	// AMQPBinding: AMQP protocol binding §3.1.3.1, application properties
	// (RabbitMQ headers) prefixed cloudEvents_; content_type property.
	AMQPBinding = Binding{Prefix: "cloudEvents_"}
	// NATSBinding: NATS protocol binding, ce- headers percent-encoded,
	// ce-datacontenttype; Content-Type marks structured mode.
	NATSBinding = Binding{Prefix: "ce-", PercentEncode: true, FormatHeader: "Content-Type"}
	// RedisStreamBinding: Redis has no CloudEvents binding; outboxd's
	// follows NATS' (fields are binary-safe, so values are not encoded):
	// ce- fields with ce-datacontenttype, and a content-type field marking
	// structured mode.
	RedisStreamBinding = Binding{Prefix: "ce-", FormatHeader: "content-type"}
)

// source is the "source" attribute.
func (ce CloudEvents) source() string {
	if ce.Source == "" {
		return DefaultCloudEventsSource
	}
	return ce.Source
}

// Attributes are ev's CloudEvents context attributes named with prefix,
// values as they are (Binding.PercentEncode is applied by Encode):
// specversion, id, source, type, time, aggregatetype, aggregateid. None when
// disabled.
func (ce CloudEvents) Attributes(ev Event, prefix string) []Header {
	if !ce.Enabled {
		return nil
	}
	return []Header{
		{prefix + "specversion", "1.0"},
		{prefix + "id", strconv.FormatInt(ev.ID, 10)},
		{prefix + "source", ce.source()},
		{prefix + "type", ev.EventType},
		{prefix + "time", ev.CreatedAt.UTC().Format(time.RFC3339Nano)},
		{prefix + "aggregatetype", ev.AggregateType},
		{prefix + "aggregateid", ev.AggregateID},
	}
}

// Binary is ev's binary-mode headers in binding b: the attributes under
// b.Prefix, the data's media type where b names a header for it, values
// percent-encoded when b says so.
func (ce CloudEvents) Binary(ev Event, b Binding) []Header {
	hs := ce.Attributes(ev, b.Prefix)
	switch {
	case b.ContentTypeHeader != "":
		hs = append(hs, Header{b.ContentTypeHeader, MediaTypeJSON})
	case b.FormatHeader != "":
		hs = append(hs, Header{b.Prefix + "datacontenttype", MediaTypeJSON})
	}
	if b.PercentEncode {
		for i := range hs {
			hs[i].Value = PercentEncode(hs[i].Value)
		}
	}
	return hs
}

// structuredEvent is the JSON event format of an outbox event.
type structuredEvent struct {
	SpecVersion     string          `json:"specversion"`
	ID              string          `json:"id"`
	Source          string          `json:"source"`
	Type            string          `json:"type"`
	Time            string          `json:"time"`
	DataContentType string          `json:"datacontenttype"`
	AggregateType   string          `json:"aggregatetype"`
	AggregateID     string          `json:"aggregateid"`
	Data            json.RawMessage `json:"data,omitempty"`
	DataBase64      []byte          `json:"data_base64,omitempty"`
}

// Structured is ev in the JSON event format: data is the payload JSON (a
// payload that is not JSON, which a jsonb column cannot hold, goes as
// data_base64).
func (ce CloudEvents) Structured(ev Event) []byte {
	a := ce.Attributes(ev, "")
	e := structuredEvent{SpecVersion: a[0].Value, ID: a[1].Value, Source: a[2].Value, Type: a[3].Value, Time: a[4].Value,
		DataContentType: MediaTypeJSON, AggregateType: a[5].Value, AggregateID: a[6].Value}
	switch {
	case json.Valid(ev.Payload):
		e.Data = ev.Payload
	case len(ev.Payload) > 0:
		e.DataContentType, e.DataBase64 = "application/octet-stream", ev.Payload
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // the payload's text as written, not <>& escaped
	if err := enc.Encode(e); err != nil {
		panic(fmt.Sprintf("dispatch: encode a CloudEvent of strings and checked JSON: %v", err))
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

// PercentEncode encodes s as the CloudEvents HTTP and NATS bindings define
// for header values (§3.1.3.2): each byte of space, '"', '%', and of every
// character outside printable ASCII (UTF-8) becomes %XY, upper-case hex.
func PercentEncode(s string) string {
	const hex = "0123456789ABCDEF"
	escape := func(c byte) bool { return c <= ' ' || c == '"' || c == '%' || c >= 0x7f }
	n := 0
	for i := range len(s) {
		if escape(s[i]) {
			n++
		}
	}
	if n == 0 {
		return s
	}
	b := make([]byte, 0, len(s)+2*n)
	for i := range len(s) {
		if c := s[i]; escape(c) {
			b = append(b, '%', hex[c>>4], hex[c&15])
		} else {
			b = append(b, c)
		}
	}
	return string(b)
}
