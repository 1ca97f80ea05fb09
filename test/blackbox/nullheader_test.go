package blackbox

import (
	"strconv"
	"testing"
)

// A JSON null header value is left out of the broker message (never sent
// as ""); other values pass unchanged.
func TestNullHeaderValueIsOmitted(t *testing.T) {
	t.Parallel()
	e := redisStreamEnv(t)
	id := e.insert("nullhdr", "1", `{}`, `{"tenant":null,"region":"eu"}`)
	e.start()
	waitFor(t, "the row dispatched", func() bool { return e.row(id).Dispatched }, e.describeRows("true"))
	entries := e.streamEntries(e.prefix + "outbox.event.nullhdr")
	if len(entries) == 0 {
		t.Fatal("no stream entry")
	}
	f := entries[0].fields
	if f["id"] != strconv.FormatInt(id, 10) || f["region"] != "eu" {
		t.Fatalf("entry fields %v: want id %d and region eu", f, id)
	}
	if v, ok := f["tenant"]; ok {
		t.Errorf("a null header reached the stream as %q; want it left out", v)
	}
}
