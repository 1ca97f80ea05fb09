package sinktest

import (
	"encoding/json"
	"fmt"
)

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
