package poller

import (
	"maps"
	"net/http"
	"testing"
	"time"

	"github.com/outboxd/outboxd/store"

	"github.com/outboxd/outboxd/internal/testkit"
)

// retryLater answers the first attempt of id with 429 and a Retry-After of
// secs seconds, everything else 204.
func retryLater(id *int64, secs string) func(testkit.Request) testkit.Reply {
	return func(r testkit.Request) testkit.Reply {
		if r.ID == *id && r.Attempt == 1 {
			return testkit.Reply{Status: http.StatusTooManyRequests, Header: http.Header{"Retry-After": {secs}}}
		}
		return testkit.Reply{}
	}
}

// refusedOnce commits a row of aggregate X whose first attempt the
// receiver answers 429 with a Retry-After of secs seconds, and returns it
// with a config that honours that (up to backoff_max).
func (e *testBundle) refusedOnce(secs string) (x1 int64, cfg testCfg) {
	x1 = e.produce("X")
	e.rc.SetRespond(retryLater(&x1, secs))
	cfg = testConfig()
	cfg.BackoffMax = 10 * time.Second
	return x1, cfg
}

// A row read while an earlier row of its aggregate backs off is blocked,
// and the cursor passes it: its aggregate is parked there (advance), so
// the row goes once the earlier one is delivered, in order with the
// aggregate's later rows. Not parked, it waited for the rescan (an hour
// here) and the later row went first.
func TestRowBlockedBehindABackingOffRowIsParked(t *testing.T) {
	e := setup(t)
	x1, cfg := e.refusedOnce("5")
	r := e.poller(cfg, "")
	r.rescanEvery = time.Hour
	e.run(r)
	e.waitFor("the first row refused with Retry-After", 20*time.Second, func() bool { return e.count("attempts = 1") == 1 })
	x2 := e.produce("X")
	probe := e.produce("P") // its delivery says a read above x2 was made
	e.waitFor("a row above the blocked one delivered", 20*time.Second, func() bool { return e.delivered(probe) })
	x3 := e.produce("X")
	if e.delivered(x1) {
		t.Fatalf("premise: row %d was delivered before the reads above the row behind it (Retry-After 5 s)", x1)
	}
	e.waitFor("the aggregate's three rows delivered", 30*time.Second, func() bool {
		return e.delivered(x1) && e.delivered(x2) && e.delivered(x3)
	})
	e.checkOrder()
}

// A holder's saved cursor stays below its parked aggregates' rows
// (saveable): a successor reads them above its cursor, in order with the
// rest of their aggregates. Here the parked row is one blocked behind a
// row backing off; the successor starts once that row is due, with a
// later row of the aggregate committed above the cursor. Saved past the
// parked row, the successor's first read took the due retry and the later
// row, not the parked one (below the cursor, known to no one; its
// term-start rescan runs after that read), and the later row went first.
func TestSavedCursorStaysBelowParkedRows(t *testing.T) {
	e := setup(t)
	x1, cfg := e.refusedOnce("6")
	a := e.poller(cfg, "")
	a.rescanEvery = time.Hour
	stopA := e.run(a)
	e.waitFor("the first row refused with Retry-After", 20*time.Second, func() bool { return e.count("attempts = 1") == 1 })
	x2 := e.produce("X") // blocked behind x1: parked once the cursor passes it
	probe := e.produce("P")
	e.waitFor("the sent mark past the blocked row saved", 20*time.Second, func() bool { return e.savedSent() >= probe })
	stopA()
	if e.delivered(x1) {
		t.Fatalf("premise: row %d was delivered by the first holder (Retry-After 6 s)", x1)
	}
	x3 := e.produce("X")
	e.waitFor("the refused row due again", 20*time.Second, func() bool {
		return e.count("available_at <= now() AND attempts = 1") == 1
	})

	b := e.poller(cfg, "")
	b.rescanEvery = time.Hour
	e.run(b)
	e.waitFor("the aggregate's three rows delivered", 30*time.Second, func() bool {
		return e.delivered(x1) && e.delivered(x2) && e.delivered(x3)
	})
	e.checkOrder()
}

// A gap found visible parks its aggregate below the cursor; the same
// read's answer for that aggregate's old first row (nothing left from it)
// must not drop it: the row would then wait for the rescan while later
// rows of its aggregate went.
func TestGapFoundVisibleStaysParkedOverTheReadsParkedAnswer(t *testing.T) {
	e := setup(t)
	p := e.poller(testConfig(), "")
	now := time.Now()
	a := store.Aggregate{Type: "deal", ID: "A"}
	r := &reader{deps: p.readDeps(), cur: readCursor{at: 100, frontier: 100}, parked: parkedSet{a: 50},
		gaps: gapWatch{runs: gapSet{{lo: 20, hi: 20, gapState: gapState{seen: now.Add(-time.Minute), givenUp: true}}}}}
	r.advance(store.ReadResult{Classified: 100, XMin: 1, XMax: 2,
		Visible: []store.Watched{{ID: 20, Aggregate: a, Pending: true}},
		Parked:  map[store.Aggregate]int64{a: 0}}, 100, now)
	if got, ok := r.parked[a]; !ok || got != 20 {
		t.Fatalf("aggregate parked at %d (%v) after its gap 20 was found pending below the cursor, want 20", got, ok)
	}
}

// A set keeps each aggregate's lowest parked id; a read's answer moves it
// to the aggregate's first row, or drops it when none is left; lowest is
// the lowest parked id of all.
func TestParkedSetKeepsTheLowestID(t *testing.T) {
	t.Parallel()
	a, b := store.Aggregate{Type: "deal", ID: "A"}, store.Aggregate{Type: "deal", ID: "B"}
	cases := []struct {
		name       string
		park       map[store.Aggregate][]int64
		answer     map[store.Aggregate]int64
		want       map[store.Aggregate]int64
		wantLowest int64
		wantGone   int
	}{
		{name: "lowest of several", park: map[store.Aggregate][]int64{a: {30, 10, 20}}, want: map[store.Aggregate]int64{a: 10}, wantLowest: 10},
		{name: "two aggregates", park: map[store.Aggregate][]int64{a: {30}, b: {5}}, want: map[store.Aggregate]int64{a: 30, b: 5}, wantLowest: 5},
		{name: "answered higher", park: map[store.Aggregate][]int64{a: {10}}, answer: map[store.Aggregate]int64{a: 40},
			want: map[store.Aggregate]int64{a: 40}, wantLowest: 40},
		{name: "answered none left", park: map[store.Aggregate][]int64{a: {10}, b: {20}}, answer: map[store.Aggregate]int64{a: 0},
			want: map[store.Aggregate]int64{b: 20}, wantLowest: 20, wantGone: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := parkedSet{}
			for agg, ids := range tc.park {
				for _, id := range ids {
					s.park(agg, id)
				}
			}
			gone := 0
			for agg, id := range tc.answer {
				if s.answer(agg, id) {
					gone++
				}
			}
			if !maps.Equal(s, parkedSet(tc.want)) || gone != tc.wantGone {
				t.Errorf("set %v, %d gone; want %v, %d gone", s, gone, tc.want, tc.wantGone)
			}
			if id, ok := s.lowest(); !ok || id != tc.wantLowest {
				t.Errorf("lowest %d (%v), want %d", id, ok, tc.wantLowest)
			}
		})
	}
	if _, ok := (parkedSet{}).lowest(); ok {
		t.Error("an empty set has a lowest id")
	}
}
