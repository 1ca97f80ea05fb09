package testkit

import (
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// pollEvery is how often WaitFor and Poll look at a condition that cannot
// signal (a row count, an HTTP answer).
const pollEvery = 20 * time.Millisecond

// Poll reports whether cond held within limit, looking every 20 ms.
func Poll(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pollEvery)
	}
	return true
}

// WaitFor polls cond until it holds; after limit the test fails, naming
// what it waited for and, when describe is not nil, the state it saw.
// Use it for conditions nothing signals; prefer a channel, Logs.WaitLine
// or Receiver.Wait when something does.
func WaitFor(t testing.TB, limit time.Duration, what string, cond func() bool, describe func() string) {
	t.Helper()
	if Poll(limit, cond) {
		return
	}
	state := ""
	if describe != nil {
		state = "; state:\n" + describe()
	}
	t.Fatalf("after %s, still waiting for %s%s", limit, what, state)
}

// WaitProgressing polls cond until it holds, like WaitFor, but fails only
// when progress (a count that grows while the work goes on: a saved
// cursor, rows delivered) stayed the same for stall: for work whose length
// is the machine's speed (a backlog drained on a loaded CI machine), so the
// test fails when the work stops, not when it is slow.
func WaitProgressing(t testing.TB, stall time.Duration, what string, cond func() bool, progress func() int64, describe func() string) {
	t.Helper()
	last, lastAt := progress(), time.Now()
	for !cond() {
		if p := progress(); p != last {
			last, lastAt = p, time.Now()
		} else if time.Since(lastAt) > stall {
			state := ""
			if describe != nil {
				state = "; state:\n" + describe()
			}
			t.Fatalf("no progress for %s (at %d), still waiting for %s%s", stall, last, what, state)
			return
		}
		time.Sleep(pollEvery)
	}
}

// LeakSettle is how long CheckLeaks lets goroutines finish: clients shut
// down asynchronously, and on a loaded two-core CI machine that can take
// longer than goleak's own half-second of retries.
const LeakSettle = 10 * time.Second

// libraryGoroutines are goroutines libraries own and may leave behind,
// not ours to wait for; every leak check ignores them.
var libraryGoroutines = []goleak.Option{
	// net/http's and the runtime's process-wide connection pools.
	goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
	goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
	goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	// OpenCensus (linked by the Pub/Sub client) starts its stats worker
	// in an init function; it lives as long as the process.
	goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
	goleak.IgnoreAnyFunction("github.com/testcontainers/testcontainers-go.(*Reaper).connect.func1"),
	// toxiproxy (the fault suite's in-process proxy) can leave a toxic's
	// pipe blocked on a channel after its proxy stopped; seen once in CI.
	goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2/toxics.(*ToxicStub).Run"),
	// nats.go v1.55 jetstream: a publisher cleaned up (connection closed)
	// before this goroutine first reads its status channel finds the
	// channel nil and waits on it forever (cleanupReplySub sets it to nil);
	// seen once in CI in dispatch/nats.
	goleak.IgnoreTopFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect"),
}

// CheckLeaks reports goroutines still running after the tests (goleak.Find
// with opts, ignoring libraryGoroutines), once they have had LeakSettle to
// finish.
func CheckLeaks(opts ...goleak.Option) error {
	opts = append(opts, libraryGoroutines...)
	deadline := time.Now().Add(LeakSettle)
	for {
		err := goleak.Find(opts...)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// VerifyTestMain runs a package's tests and fails the run when a goroutine
// outlives them (see CheckLeaks). Use it from TestMain.
func VerifyTestMain(m *testing.M, opts ...goleak.Option) {
	code := m.Run()
	if code == 0 {
		if err := CheckLeaks(opts...); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
