package testkit_test

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/outboxd/outboxd/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Lines written in pieces from many goroutines come out whole, and a
// waiter is woken by the lines it waits for.
func TestLogsSplitLinesAndWake(t *testing.T) {
	t.Parallel()
	var logs testkit.Logs
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 50 {
				// One Write per line, as slog handlers do; exec's copy may split.
				fmt.Fprintf(&logs, `{"g":%d,"i":%d}`+"\n", g, i)
			}
		})
	}
	got := logs.WaitLines(t, 10*time.Second, "200 lines", 200, func(string) bool { return true })
	wg.Wait()
	if len(got) != 200 || len(logs.Lines()) != 200 || logs.Count(`"i":49}`) != 4 {
		t.Fatalf("%d matched, %d lines, %d last lines", len(got), len(logs.Lines()), logs.Count(`"i":49}`))
	}

	var split testkit.Logs
	done := make(chan string)
	go func() { done <- split.WaitLine(t, 10*time.Second, "wanted") }()
	_, _ = split.Write([]byte("other\nwan"))
	_, _ = split.Write([]byte("ted line\ntrailing"))
	if line := <-done; line != "wanted line" {
		t.Fatalf("woke on %q", line)
	}
	if s := split.String(); s != "other\nwanted line\ntrailing" {
		t.Fatalf("String %q", s)
	}
	if l := split.Lines(); len(l) != 3 || l[2] != "trailing" {
		t.Fatalf("Lines %q: want the unfinished last line too", l)
	}
	if _, ok := split.Await(50*time.Millisecond, 1, func(s string) bool { return s == "trailing" }); ok {
		t.Fatal("Await matched a line before its newline")
	}
}

// Writer passes lines to t.Log while the test runs and drops them after.
func TestWriterAfterTheTest(t *testing.T) {
	t.Parallel()
	var w interface{ Write([]byte) (int, error) }
	t.Run("inner", func(t *testing.T) {
		w = testkit.Writer(t)
		testkit.Logger(t).Info("during the test")
	})
	if _, err := w.Write([]byte("after the test\n")); err != nil { // must not panic
		t.Fatal(err)
	}
}

func post(t *testing.T, url, body string, token int) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("X-Fencing-Token", fmt.Sprint(token))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("post: %v", err)
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

func ev(id int, agg string) string {
	typ, aid, _ := strings.Cut(agg, "/")
	return fmt.Sprintf(`{"id":%d,"aggregate_type":%q,"aggregate_id":%q}`, id, typ, aid)
}

// Per-aggregate answers, attempts counted per event, a held request
// answered (and recorded) at release, and waits that wake on arrivals.
func TestReceiverAnswersHoldsAndRecords(t *testing.T) {
	t.Parallel()
	rc := testkit.NewReceiver(t)
	rc.SetRespond(func(r testkit.Request) testkit.Reply {
		if r.Agg == "deal/bad" && r.Attempt == 1 {
			return testkit.Reply{Status: http.StatusServiceUnavailable, Header: http.Header{"Retry-After": {"1"}}}
		}
		return testkit.Reply{}
	})
	if code := post(t, rc.URL(), ev(1, "deal/bad"), 3); code != http.StatusServiceUnavailable {
		t.Fatalf("first attempt answered %d", code)
	}
	if code := post(t, rc.URL(), ev(1, "deal/bad"), 3); code != http.StatusNoContent {
		t.Fatalf("second attempt answered %d", code)
	}

	release := rc.Hold(testkit.HoldAggregate("deal/held"))
	answered := make(chan int)
	go func() { answered <- post(t, rc.URL(), ev(2, "deal/held"), 3) }()
	rc.WaitHeld(t, 10*time.Second, 1)
	if rc.OKCounts()[2] != 0 {
		t.Fatal("a held request counted as delivered")
	}
	rc.SetRespond(testkit.Statuses(map[string]int{"deal/held": http.StatusAccepted}))
	release()
	release() // idempotent
	if code := <-answered; code != http.StatusAccepted {
		t.Fatalf("held request answered %d, want the answer set before its release", code)
	}
	rc.WaitDelivered(t, 10*time.Second, 2)

	reqs := rc.Requests()
	if len(reqs) != 3 || reqs[1].Attempt != 2 || reqs[2].Token != 3 || reqs[0].OK() || !reqs[2].OK() ||
		reqs[2].Agg != "deal/held" || !bytes.Equal(reqs[2].Body, []byte(ev(2, "deal/held"))) {
		t.Fatalf("requests %+v", reqs)
	}
}

// The checks find a late first delivery and a token going back, and only
// from the given time on.
func TestOrderAndTokenViolations(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	reqs := []testkit.Request{
		{ID: 1, Agg: "a/1", Token: 1, Status: 204, At: at(0)},
		{ID: 3, Agg: "a/1", Token: 2, Status: 503, At: at(1)}, // a failure does not count
		{ID: 2, Agg: "a/1", Token: 2, Status: 204, At: at(2)},
		{ID: 3, Agg: "a/1", Token: 2, Status: 204, At: at(3)},
		{ID: 1, Agg: "a/1", Token: 2, Status: 204, At: at(4)}, // a duplicate is no reordering
	}
	if v := testkit.OrderViolations(reqs); len(v) != 0 {
		t.Fatalf("in order, got %v", v)
	}
	if v := testkit.TokenViolations(reqs, at(0)); len(v) != 0 {
		t.Fatalf("rising tokens, got %v", v)
	}
	reqs = append(reqs,
		testkit.Request{ID: 5, Agg: "a/1", Token: 1, Status: 204, At: at(5)},
		testkit.Request{ID: 4, Agg: "a/1", Token: 2, Status: 204, At: at(6)})
	if v := testkit.OrderViolations(reqs); len(v) != 1 || !strings.Contains(v[0], "event 4 first delivered after 5") {
		t.Fatalf("got %v", v)
	}
	if v := testkit.TokenViolations(reqs, at(0)); len(v) != 1 || !strings.Contains(v[0], "event 5 arrived with token 1 after token 2") {
		t.Fatalf("got %v", v)
	}
	if v := testkit.TokenViolations(reqs, at(5)); len(v) != 0 {
		t.Fatalf("from the fault on, got %v", v)
	}
	if n := testkit.Tokens(reqs); n != 2 {
		t.Fatalf("%d tokens", n)
	}
}

// fatalT records a Fatalf instead of ending the test.
type fatalT struct {
	testing.TB
	msg string
}

func (f *fatalT) Helper() {}

func (f *fatalT) Fatalf(format string, args ...any) { f.msg = fmt.Sprintf(format, args...) }

// WaitProgressing waits as long as the work moves, however long that is
// beyond its stall limit, and fails once it stops moving.
func TestWaitProgressingFailsOnAStallOnly(t *testing.T) {
	// Moving at every look, done after 50 looks (at least 1 s of 20 ms
	// sleeps, ten times the stall limit).
	moving, looks := &fatalT{TB: t}, int64(0)
	testkit.WaitProgressing(moving, 100*time.Millisecond, "the slow work",
		func() bool { return looks >= 50 }, func() int64 { looks++; return looks }, nil)
	if moving.msg != "" {
		t.Fatalf("work that kept moving failed: %s", moving.msg)
	}
	stalled := &fatalT{TB: t}
	testkit.WaitProgressing(stalled, 100*time.Millisecond, "the stalled work",
		func() bool { return false }, func() int64 { return 7 }, func() string { return "stuck at 7" })
	if !strings.Contains(stalled.msg, "no progress for 100ms (at 7), still waiting for the stalled work; state:\nstuck at 7") {
		t.Fatalf("stalled work: %q, want a failure naming the stall", stalled.msg)
	}
}
