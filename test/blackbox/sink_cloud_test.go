package blackbox

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// failureCase is one cloud sink's failure test (TestPubSubSinkFailures,
// TestKinesisSinkFailures): its env relays to a destination where the
// template's "outbox.event.order" exists and "outbox.event.missing" does
// not.
type failureCase struct {
	e *testBundle
	// kind names the destination in last_error: "topic", "stream".
	kind string
	// oversize is a payload above the destination's message limit, and
	// tooLarge what the last_error of its row says.
	oversize, tooLarge string
	create             func()             // creates outbox.event.missing
	read               func() []delivered // what outbox.event.missing holds
}

// checkFailures: rows for the missing destination are retried with a
// last_error naming it and saying to create it; a row above the message
// limit is dead-lettered and the next row of its aggregate goes through;
// the other aggregates flow meanwhile. Once the destination exists the
// retried rows go through, each aggregate in order.
func checkFailures(t *testing.T, c failureCase) {
	e := c.e.set("OUTBOXD_POLLER_MAX_ATTEMPTS", "1000")
	var missing []int64
	for i := range 6 {
		missing = append(missing, e.insert("missing", strconv.Itoa(i%2), `{"m":`+strconv.Itoa(i)+`}`, ""))
	}
	big := e.insert("order", "big", c.oversize, "")
	after := e.insert("order", "big", `{"after":1}`, "")
	flowing := e.insertMany("order", 5, 4)
	e.start()
	waitFor(t, "the other aggregates' rows dispatched", func() bool {
		return e.count("aggregate_type = 'order' AND aggregate_id <> 'big' AND dispatched_at IS NOT NULL") == len(flowing)
	}, e.describeRows("aggregate_type = 'order'"))
	waitFor(t, "the oversize row dead-lettered, the next of its aggregate dispatched", func() bool {
		return e.row(big).Dead && e.row(after).Dispatched
	}, e.describeRows("aggregate_id = 'big'"))
	if w := e.row(big); !strings.Contains(w.LastError, c.tooLarge) {
		t.Errorf("oversize row: %s, want a last_error saying %q", w, c.tooLarge)
	}
	waitFor(t, "the rows without a "+c.kind+" retried, saying so", func() bool {
		return e.count(`aggregate_type = 'missing' AND attempts >= 2 AND last_error LIKE '%does not exist%'`) >= 2
	}, e.describeRows("aggregate_type = 'missing'"))
	for _, w := range e.rows("aggregate_type = 'missing'") {
		if w.Dispatched || w.Dead {
			t.Fatalf("row without a %s settled: %s", c.kind, w)
		}
		if w.Attempts > 0 && (!strings.Contains(w.LastError, c.kind+` "outbox.event.missing"`) || !strings.Contains(w.LastError, "create it")) {
			t.Errorf("last_error does not name the %s and the fix: %s", c.kind, w)
		}
	}
	t.Logf("last_error: %s", e.rows("aggregate_type = 'missing' AND attempts > 0")[0].LastError)
	t.Logf("oversize: %s", e.row(big).LastError)

	c.create()
	waitFor(t, "the rows dispatched once the "+c.kind+" exists", func() bool {
		return e.count("aggregate_type = 'missing' AND dispatched_at IS NOT NULL") == len(missing)
	}, e.describeRows("aggregate_type = 'missing'"))
	order, _ := checkContract(t, c.read(), "missing", e.payloads("aggregate_type = 'missing'"), "")
	want := map[string][]int64{"0": {missing[0], missing[2], missing[4]}, "1": {missing[1], missing[3], missing[5]}}
	if fmt.Sprint(order) != fmt.Sprint(want) {
		t.Errorf("%s holds per aggregate %v, want %v", c.kind, order, want)
	}
}
