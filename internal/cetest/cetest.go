// Package cetest reads, in tests, the messages outboxd sent as a
// CloudEvents consumer would: with the CloudEvents SDK, over headers named
// as each protocol binding's specification names them. It knows nothing
// of outboxd's own mapping, so a wrong prefix or encoding fails the test.
// Only tests import it (the bench module does not carry the SDK).
package cetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	"github.com/cloudevents/sdk-go/v2/event"
)

// Message is a message as received, described the way a
// CloudEvents protocol binding's specification reads it. Decode
// turns it into an event with the CloudEvents SDK's binding package
// (binding.ToEvent): the SDK's protocol modules for Kafka, AMQP and NATS are
// not on the Go module proxy here, and Redis Streams has no binding, so
// this adapter over the raw headers stands in for them. Everything it
// knows comes from the specifications, nothing from outboxd's code.
type Message struct {
	// Prefix of the attribute headers in binary mode: "ce_" (Kafka
	// binding §3.2.3.1), "cloudEvents_" (AMQP §3.1.3.1), "ce-" (NATS
	// §3.1.3.1).
	Prefix string
	// PercentDecode: attribute values are percent-encoded (NATS §3.1.3.2).
	PercentDecode bool
	// ContentType is the protocol's own content type, "" if none (Kafka's
	// content-type header, AMQP's content_type property, NATS'
	// Content-Type header): structured mode when it names an event
	// format; otherwise, in binary mode, datacontenttype.
	ContentType string
	Headers     map[string]string
	Body        []byte
}

// Decode reads m with the SDK: binding.ToEvent, then Validate.
func Decode(m Message) (*event.Event, error) {
	r := &ceReader{m: m, attrs: map[string]string{}}
	vs := spec.WithPrefix(m.Prefix)
	for k, val := range m.Headers {
		if len(k) <= len(m.Prefix) || !strings.EqualFold(k[:len(m.Prefix)], m.Prefix) {
			continue
		}
		if m.PercentDecode {
			d, err := url.PathUnescape(val)
			if err != nil || !utf8.ValidString(d) {
				return nil, fmt.Errorf("header %s: %q is not a valid percent-encoded UTF-8 value: %v", k, val, err)
			}
			val = d
		}
		r.attrs[strings.ToLower(k[len(m.Prefix):])] = val
	}
	if format.Lookup(m.ContentType) == nil {
		r.version = vs.Version(r.attrs["specversion"])
		if r.version != nil && m.ContentType != "" {
			r.attrs["datacontenttype"] = m.ContentType
		}
	}
	ev, err := binding.ToEvent(context.Background(), r)
	if err != nil {
		return nil, err
	}
	return ev, ev.Validate()
}

// ceReader is a binding.Message over the decoded attributes (names without
// the prefix).
type ceReader struct {
	m       Message
	attrs   map[string]string
	version spec.Version // nil unless binary mode
}

func (r *ceReader) ReadEncoding() binding.Encoding {
	switch {
	case format.Lookup(r.m.ContentType) != nil:
		return binding.EncodingStructured
	case r.version != nil:
		return binding.EncodingBinary
	}
	return binding.EncodingUnknown
}

func (r *ceReader) ReadStructured(ctx context.Context, w binding.StructuredWriter) error {
	f := format.Lookup(r.m.ContentType)
	if f == nil {
		return binding.ErrNotStructured
	}
	return w.SetStructuredEvent(ctx, f, bytes.NewReader(r.m.Body))
}

func (r *ceReader) ReadBinary(_ context.Context, w binding.BinaryWriter) error {
	if r.version == nil {
		return binding.ErrNotBinary
	}
	for name, val := range r.attrs {
		var err error
		if a := r.version.Attribute(r.version.Prefix() + name); a != nil {
			err = w.SetAttribute(a, val)
		} else {
			err = w.SetExtension(name, val)
		}
		if err != nil {
			return fmt.Errorf("attribute %s: %w", name, err)
		}
	}
	return w.SetData(bytes.NewReader(r.m.Body))
}

func (r *ceReader) GetAttribute(k spec.Kind) (spec.Attribute, any) {
	if r.version == nil {
		return nil, nil
	}
	a := r.version.AttributeFromKind(k)
	if a == nil {
		return nil, nil
	}
	if v, ok := r.attrs[a.Name()]; ok {
		return a, v
	}
	return a, nil
}

func (r *ceReader) GetExtension(name string) any {
	if v, ok := r.attrs[name]; ok {
		return v
	}
	return nil
}

func (r *ceReader) Finish(error) error { return nil }

// CheckEvent decodes m (Decode) and compares the event with w (Check),
// after checking m's mode: structured exactly when its content type is the
// JSON event format (a sink that sent binary when asked for structured
// would decode too).
func CheckEvent(m Message, structured bool, w Want) error {
	if got := m.ContentType == "application/cloudevents+json"; got != structured {
		return fmt.Errorf("content type %q, want structured mode %v", m.ContentType, structured)
	}
	ev, err := Decode(m)
	if err != nil {
		return fmt.Errorf("the CloudEvents SDK does not decode it: %w", err)
	}
	return Check(ev, w)
}

// Want is what the CloudEvent of an outbox row must say.
type Want struct {
	ID            int64
	Source        string
	Type          string // event_type
	Time          time.Time
	AggregateType string
	AggregateID   string
	Data          string // JSON, compared as a value
}

// Check compares a decoded event with w: specversion 1.0, id,
// source, type, time, datacontenttype application/json, the extensions
// aggregatetype and aggregateid, and data equal to w.Data as JSON.
func Check(ev *event.Event, w Want) error {
	var errs []error
	check := func(what string, got, want any) {
		if !reflect.DeepEqual(got, want) {
			errs = append(errs, fmt.Errorf("%s %#v, want %#v", what, got, want))
		}
	}
	check("specversion", ev.SpecVersion(), "1.0")
	check("id", ev.ID(), strconv.FormatInt(w.ID, 10))
	check("source", ev.Source(), w.Source)
	check("type", ev.Type(), w.Type)
	if !ev.Time().Equal(w.Time) {
		errs = append(errs, fmt.Errorf("time %s, want %s", ev.Time(), w.Time))
	}
	check("datacontenttype", ev.DataContentType(), "application/json")
	ext := ev.Extensions()
	check("extension aggregatetype", ext["aggregatetype"], any(w.AggregateType))
	check("extension aggregateid", ext["aggregateid"], any(w.AggregateID))
	var got, want any
	if err := json.Unmarshal(ev.Data(), &got); err != nil {
		errs = append(errs, fmt.Errorf("data %q is not JSON: %w", ev.Data(), err))
	} else if err := json.Unmarshal([]byte(w.Data), &want); err != nil {
		errs = append(errs, fmt.Errorf("want data %q is not JSON: %w", w.Data, err))
	} else {
		check("data", got, want)
	}
	return errors.Join(errs...)
}
