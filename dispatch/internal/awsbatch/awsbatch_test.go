package awsbatch

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/dispatch"
)

// TestChunksKeepTheCallLimits: at most ten messages and MaxCallBytes per
// call; a message above MaxCallBytes alone.
func TestChunksKeepTheCallLimits(t *testing.T) {
	msgs := func(sizes ...int) ([]Message, []int) {
		var out []Message
		var idx []int
		for i, n := range sizes {
			out, idx = append(out, Message{Body: strings.Repeat("x", n)}), append(idx, i)
		}
		return out, idx
	}
	shape := func(cs [][]int) string {
		var parts []string
		for _, c := range cs {
			parts = append(parts, fmt.Sprint(len(c)))
		}
		return strings.Join(parts, ",")
	}
	m, idx := msgs(make([]int, 25)...)
	if got := shape(chunks(m, idx)); got != "10,10,5" {
		t.Errorf("25 small messages: calls of %s, want 10,10,5", got)
	}
	m, idx = msgs(100<<10, 100<<10, 100<<10, 300<<10, 1)
	if got := shape(chunks(m, idx)); got != "2,1,1,1" {
		t.Errorf("100 KiB x3, 300 KiB, 1 B: calls of %s, want 2,1,1,1", got)
	}
}

// TestAttributeNamesAndGroupIDs: AWS's name rules, and group ids that are
// the aggregate when valid, a hash otherwise.
func TestAttributeNamesAndGroupIDs(t *testing.T) {
	for name, want := range map[string]bool{"traceparent": true, "ce-id": true, "a.b_c-D9": true, "": false, ".a": false,
		"a.": false, "a..b": false, "AWS.x": false, "amazon.x": false, "a b": false, "é": false, strings.Repeat("a", 257): false} {
		if AttributeName(name) != want {
			t.Errorf("AttributeName(%q) = %v", name, !want)
		}
	}
	if g := GroupID(dispatch.Event{AggregateType: "deal", AggregateID: "42"}); g != "deal/42" {
		t.Errorf("group %q", g)
	}
	long := GroupID(dispatch.Event{AggregateType: "deal", AggregateID: strings.Repeat("9", 200)})
	spaced := GroupID(dispatch.Event{AggregateType: "deal", AggregateID: "4 2"})
	if !strings.HasPrefix(long, "sha256-") || len(long) > 128 || !strings.HasPrefix(spaced, "sha256-") || long == spaced {
		t.Errorf("hashed groups %q, %q", long, spaced)
	}
}

// TestAttributesDropWhatAnAttributeCannotCarry: an empty value, a bad
// name, a U+FFFF character are dropped and named; a row header named like
// the packed attribute too.
func TestAttributesDropWhatAnAttributeCannotCarry(t *testing.T) {
	ev := dispatch.Event{ID: 1, AggregateType: "t", AggregateID: "a", EventType: "e",
		Headers: json.RawMessage(`{"ok":"v","empty":"","bad name":"v","odd":"\uffff","outboxd-headers":"x"}`)}
	m, dropped := NewMessage(ev, 1, dispatch.CloudEvents{}, false)
	attrs := m.Attributes
	if len(attrs) != 7 || attrs[6].Key != "ok" {
		t.Errorf("attributes %v, want the contract's six and ok", attrs)
	}
	if fmt.Sprint(dropped) != "[bad name empty odd outboxd-headers]" {
		t.Errorf("dropped %v", dropped)
	}
}

// TestAnswersFailAnEntryTheServiceLeftOut: the answers of a call of four
// whose service named entry 0 accepted, entry 2 refused, entry 3 twice
// over (ignoring an id out of range and one that is not a number): entry 1,
// never named, is refused with NoAnswer, which SQS and SNS retry.
func TestAnswersFailAnEntryTheServiceLeftOut(t *testing.T) {
	id := func(s string) *string { return &s }
	x := NewAnswers(4)
	x.Accepted(id("0"), "m0")
	x.Refused(id("2"), id("InternalError"), id("try again"), false)
	x.Accepted(id("3"), "m3")
	x.Accepted(id("3"), "m3")
	x.Accepted(id("4"), "m4")
	x.Accepted(id("x"), "mx")
	list := x.List()
	want := []Answer{{Ref: "m0"}, {Code: "NoAnswer", Message: "the service answered the call without this entry"},
		{Code: "InternalError", Message: "try again"}, {Ref: "m3"}}
	if !slices.Equal(list, want) {
		t.Fatalf("answers %+v, want %+v", list, want)
	}
	s := NewSender(Sender{Service: "sqs", Target: `queue "q"`, Permanent: func(string) bool { return false }}, 1)
	if r := s.entryResult(2, list[1]); r.Outcome != dispatch.Retryable || !strings.Contains(r.Err.Error(), "without this entry") {
		t.Errorf("entry left out: %v (%v), want retryable, saying so", r.Outcome, r.Err)
	}
}
