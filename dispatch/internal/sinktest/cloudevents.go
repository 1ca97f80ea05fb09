package sinktest

import (
	"encoding/json"
	"fmt"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/internal/cetest"
)

// CheckCloudEvent decodes m with the CloudEvents SDK (internal/cetest, which
// knows the specifications, not outboxd's code) and compares the event with
// ev's: source outboxd, data the payload. m must be in mode: structured
// when its content type is the JSON event format, binary otherwise (a
// sink that sent binary when asked for structured would decode too).
func CheckCloudEvent(m cetest.Message, ev dispatch.Event, mode string) error {
	if structured := m.ContentType == "application/cloudevents+json"; structured != (mode == dispatch.CloudEventsStructured) {
		return fmt.Errorf("content type %q in %s mode", m.ContentType, mode)
	}
	got, err := cetest.Decode(m)
	if err != nil {
		return fmt.Errorf("the CloudEvents SDK does not decode it: %w", err)
	}
	return cetest.Check(got, cetest.Want{ID: ev.ID, Source: "outboxd", Type: ev.EventType, Time: ev.CreatedAt,
		AggregateType: ev.AggregateType, AggregateID: ev.AggregateID, Data: string(ev.Payload)})
}

// Unpacked is an SQS or SNS message's attributes as docs/sinks/sqs.md tells
// a consumer to read them: its own, then those packed as a JSON object
// into the "outboxd-headers" attribute.
func Unpacked(attrs map[string]string) (map[string]string, error) {
	out := map[string]string{}
	if packed, ok := attrs["outboxd-headers"]; ok {
		if err := json.Unmarshal([]byte(packed), &out); err != nil {
			return nil, fmt.Errorf("outboxd-headers %q: %w", packed, err)
		}
	}
	for k, v := range attrs {
		if k != "outboxd-headers" {
			out[k] = v
		}
	}
	return out, nil
}
