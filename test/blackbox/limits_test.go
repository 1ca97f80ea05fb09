package blackbox

import (
	"strconv"
	"strings"
	"testing"
)

// Black-box tests: broker limits are known before sending. A message that can never fit is dead-lettered at once, alone;
// no other row pays an attempt or a duplicate publish for it.

// bigHeaders is a row headers object of about n bytes.
func bigHeaders(n int) string {
	return `{"big":"` + strings.Repeat("x", n) + `"}`
}

// A row with 200 KB of headers, and one with a 150 KB aggregate_id, are
// above RabbitMQ's frame_max (128 KiB: the header frame cannot be split);
// the broker would close the connection on them. Rows of other aggregates
// in the same batch are published once each and never charged an attempt.
func TestRabbitMQHeaderFrameAboveFrameMax(t *testing.T) {
	t.Parallel()
	rx := newRabbitExchange(t)
	q := rx.queue("outbox.event.#")
	e := rabbitEnv(t, rx)
	e.set("OUTBOXD_POLLER_MAX_ATTEMPTS", "25", "OUTBOXD_POLLER_BACKOFF_BASE", "200ms", "OUTBOXD_POLLER_BACKOFF_MAX", "200ms")
	before := e.insertMany("order", 20, 5)
	bigHdr := e.insert("order", "poison", `{}`, bigHeaders(200<<10))
	bigID := e.insert("order", strings.Repeat("k", 150<<10), `{}`, "")
	after := e.insertMany("invoice", 20, 5)
	e.start()

	waitFor(t, "the innocent rows dispatched and the oversized rows dead", func() bool {
		return e.count(`dispatched_at IS NOT NULL`) == len(before)+len(after) && e.row(bigHdr).Dead && e.row(bigID).Dead
	}, e.describeRows(`dispatched_at IS NULL`))
	for _, id := range []int64{bigHdr, bigID} {
		if w := e.row(id); w.Attempts != 1 || !strings.Contains(w.LastError, "frame_max") {
			t.Errorf("oversized row: want dead on its first attempt with a last_error naming frame_max; got %s", w)
		}
	}
	if n := e.count(`attempts > 0 AND id NOT IN ($1, $2)`, bigHdr, bigID); n != 0 {
		t.Errorf("%d innocent rows were charged attempts:\n%s", n, e.describeRows(`attempts > 0`)())
	}
	seen := map[int64]int{}
	for _, d := range rx.drain(q) {
		id, _ := strconv.ParseInt(d.MessageId, 10, 64)
		seen[id]++
	}
	if dups := consumedOnce(t, append(before, after...), seen, "the queue"); dups != 0 {
		t.Errorf("%d innocent rows were published more than once", dups)
	}
	if seen[bigHdr]+seen[bigID] != 0 {
		t.Errorf("an oversized row reached the queue")
	}
}

// NATS JetStream refuses a header block above 64 KiB for ever: such a row
// is dead-lettered on its first attempt, not retried for hours, and the
// rest flow.
func TestNATSHeaderBlockAboveLimit(t *testing.T) {
	t.Parallel()
	ns := newNATSStream(t, "*")
	e := natsEnv(t, ns)
	e.set("OUTBOXD_POLLER_MAX_ATTEMPTS", "25", "OUTBOXD_POLLER_BACKOFF_BASE", "200ms", "OUTBOXD_POLLER_BACKOFF_MAX", "200ms")
	ids := e.insertMany("order", 5, 2)
	big := e.insert("order", "poison", `{}`, bigHeaders(70<<10))
	e.start()
	waitFor(t, "the other rows dispatched and the big-header row dead", func() bool {
		return e.count(`dispatched_at IS NOT NULL`) == len(ids) && e.row(big).Dead
	}, e.describeRows(`dispatched_at IS NULL`))
	if w := e.row(big); w.Attempts != 1 || !strings.Contains(w.LastError, "header") {
		t.Errorf("big-header row: want dead on its first attempt with a last_error about its headers; got %s", w)
	}
}
