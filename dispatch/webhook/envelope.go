package webhook

import (
	"bytes"
	"encoding/json"
	"strconv"
	"time"

	"github.com/outboxd/outboxd/dispatch"
)

// envelope is the contract's JSON body of ev, byte for byte what
// json.Marshal(ev) writes, appended to a buffer sized once: no reflection,
// and the payload and headers compacted straight into the body. Anything
// the fast path does not write as encoding/json would (a name to escape, a
// text with <, > or &, a year outside 0-9999, JSON that does not parse) is
// left to json.Marshal, whose bytes or error are returned.
func envelope(ev dispatch.Event) ([]byte, error) {
	if b, ok := envelopeFast(ev); ok {
		return b, nil
	}
	return json.Marshal(ev)
}

func envelopeFast(ev dispatch.Event) ([]byte, bool) {
	if y := ev.CreatedAt.Year(); y < 0 || y > 9999 || !plain(ev.AggregateType) || !plain(ev.AggregateID) || !plain(ev.EventType) ||
		!htmlSafe(ev.Payload) || !htmlSafe(ev.Headers) {
		return nil, false
	}
	var buf bytes.Buffer
	buf.Grow(len(ev.AggregateType) + len(ev.AggregateID) + len(ev.EventType) + len(ev.Payload) + len(ev.Headers) + 160)
	b := buf.AvailableBuffer()
	b = append(b, `{"id":`...)
	b = strconv.AppendInt(b, ev.ID, 10)
	b = appendField(b, `,"aggregate_type":"`, ev.AggregateType)
	b = appendField(b, `","aggregate_id":"`, ev.AggregateID)
	b = appendField(b, `","event_type":"`, ev.EventType)
	b = append(b, `","payload":`...)
	buf.Write(b)
	if !compactRaw(&buf, ev.Payload) {
		return nil, false
	}
	buf.WriteString(`,"headers":`)
	if !compactRaw(&buf, ev.Headers) {
		return nil, false
	}
	b = buf.AvailableBuffer()
	b = append(b, `,"created_at":"`...)
	b = ev.CreatedAt.AppendFormat(b, time.RFC3339Nano)
	b = append(b, `"}`...)
	buf.Write(b)
	return buf.Bytes(), true
}

func appendField(b []byte, name, value string) []byte {
	return append(append(b, name...), value...)
}

// compactRaw writes m as json.Marshal writes a json.RawMessage field:
// "null" when nil, else compacted; false when m does not parse.
func compactRaw(buf *bytes.Buffer, m json.RawMessage) bool {
	if m == nil {
		buf.WriteString("null")
		return true
	}
	return json.Compact(buf, m) == nil
}

// plain is whether encoding/json writes s between quotes as it is: printable
// ASCII, none of " \ < > &.
func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c > 0x7e, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}

// htmlSafe is whether encoding/json's HTML escaping leaves m as it is:
// no <, > or &, and no U+2028 or U+2029.
func htmlSafe(m []byte) bool {
	return !bytes.ContainsAny(m, "<>&") && !bytes.Contains(m, []byte("\u2028")) && !bytes.Contains(m, []byte("\u2029"))
}
