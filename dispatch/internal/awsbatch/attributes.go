package awsbatch

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/outboxd/outboxd/dispatch"
)

// MaxAttributes is the most message attributes SQS takes per message (and
// SNS delivers to an SQS subscription).
const MaxAttributes = 10

// PackedAttribute carries, as one JSON object of strings, the headers past
// the first MaxAttributes-1 when a message has more than MaxAttributes.
const PackedAttribute = "outboxd-headers"

// Binding is how SQS and SNS messages carry a CloudEvent. CloudEvents has
// no SQS or SNS binding; outboxd's follows NATS' (as Redis streams do):
// ce- attributes with ce-datacontenttype in binary mode, and a
// content-type attribute marking structured mode.
var Binding = dispatch.Binding{Prefix: "ce-", FormatHeader: "content-type"}

// Attributes are the message attributes of hs (dispatch.Encode's headers,
// in their order: the contract's six, the row's own, the CloudEvents ones), each a String
// attribute, leaving out those an attribute cannot carry (the name rules of
// AttributeName, an empty value, characters SQS refuses). When more than
// MaxAttributes remain, the first MaxAttributes-1 are attributes and the
// rest are packed into PackedAttribute. dropped names what was left out.
func Attributes(hs []dispatch.Header, dropped []string) (attrs []dispatch.Header, _ []string) {
	attrs = make([]dispatch.Header, 0, len(hs))
	for _, h := range hs {
		if !AttributeName(h.Key) || strings.EqualFold(h.Key, PackedAttribute) || !textSafe(h.Value) {
			dropped = append(dropped, h.Key)
			continue
		}
		attrs = append(attrs, h)
	}
	if len(attrs) <= MaxAttributes {
		return attrs, dropped
	}
	rest := map[string]string{}
	for _, h := range attrs[MaxAttributes-1:] {
		rest[h.Key] = h.Value
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(rest) // strings only: cannot fail
	return append(attrs[:MaxAttributes-1], dispatch.Header{Key: PackedAttribute, Value: strings.TrimSuffix(buf.String(), "\n")}), dropped
}

// AttributeName reports whether SQS and SNS take name as a message
// attribute name: 1 to 256 of A-Z a-z 0-9 _ - ., not starting with "AWS."
// or "Amazon." (any case), no period first, last or twice in a row.
func AttributeName(name string) bool {
	for _, rule := range attributeNameRules {
		if !rule(name) {
			return false
		}
	}
	return true
}

// attributeNameRules are AttributeName's rules; the first makes sure the
// others see a name of at least one byte.
var attributeNameRules = []func(string) bool{
	attributeNameLength,
	periodsInside,
	notReservedByAWS,
	attributeNameChars,
}

// attributeNameLength: 1 to 256 bytes.
func attributeNameLength(name string) bool { return name != "" && len(name) <= 256 }

// periodsInside: no period first, last or twice in a row.
func periodsInside(name string) bool {
	return name[0] != '.' && name[len(name)-1] != '.' && !strings.Contains(name, "..")
}

// notReservedByAWS: not starting with "AWS." or "Amazon.", in any case.
func notReservedByAWS(name string) bool {
	lower := strings.ToLower(name)
	return !strings.HasPrefix(lower, "aws.") && !strings.HasPrefix(lower, "amazon.")
}

// attributeNameChars: only A-Z a-z 0-9 _ - .
func attributeNameChars(name string) bool {
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// textSafe: a non-empty attribute value of the characters SQS accepts
// (#x9 #xA #xD, #x20 to #xD7FF, #xE000 to #xFFFD, #x10000 to #x10FFFF).
func textSafe(s string) bool {
	if s == "" || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		switch {
		case r == 0x9 || r == 0xA || r == 0xD:
		case r < 0x20, r >= 0xD800 && r < 0xE000, r == 0xFFFE || r == 0xFFFF:
			return false
		}
	}
	return true
}

// GroupID is the FIFO message group of ev's aggregate:
// "{aggregate_type}/{aggregate_id}" when that is a valid group id (1 to 128
// printable ASCII characters), else "sha256-" and the hex SHA-256 of the
// length-prefixed pair (a rare aggregate with other characters or a long
// name keeps a group of its own).
func GroupID(ev dispatch.Event) string {
	g := ev.AggregateType + "/" + ev.AggregateID
	if len(g) <= 128 && printableASCII(g) {
		return g
	}
	sum := sha256.Sum256([]byte(strconv.Itoa(len(ev.AggregateType)) + ":" + ev.AggregateType + "/" + ev.AggregateID))
	return "sha256-" + hex.EncodeToString(sum[:])
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// NewMessage is ev's message: the payload as the body (in CloudEvents'
// structured mode the event in the JSON format), Attributes, and on a
// FIFO destination GroupID and ev.DedupeID() ("<id>:<fingerprint>") as
// the deduplication id: SQS and SNS take a success for a repeat within
// five minutes, which is then the same row's message, never another row's
// with the id.
func NewMessage(ev dispatch.Event, token int64, ce dispatch.CloudEvents, fifo bool) (Message, []string) {
	enc := dispatch.Encode(ev, token, ce, Binding)
	attrs, dropped := Attributes(enc.Headers, enc.Dropped)
	m := Message{Body: string(enc.Body), Attributes: attrs}
	if fifo {
		m.GroupID, m.DedupID = GroupID(ev), ev.DedupeID()
	}
	return m, dropped
}
