package testkit

import (
	"testing"
	"time"
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
