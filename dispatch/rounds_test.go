package dispatch_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/outboxd/outboxd/dispatch"
)

// eventsOf are events 1..n of aggregates aggs (one per event), of type "t".
func eventsOf(aggs ...string) []dispatch.Event {
	return batchOf(aggs...).Events
}

// TestRoundsNext: round k holds each aggregate's k-th event, in batch
// order; an aggregate whose event was not delivered (a failure, or a
// result never set) takes no part in later rounds.
func TestRoundsNext(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		fail map[int]bool // indexes answered Retryable
		skip map[int]bool // indexes given but never Set
		want string
	}{
		{name: "all delivered", want: "[[0 2 4] [1 5] [3]]"},
		{name: "a fails first", fail: map[int]bool{0: true}, want: "[[0 2 4] [5]]"},
		{name: "b fails second", fail: map[int]bool{5: true}, want: "[[0 2 4] [1 5] [3]]"},
		{name: "a's second never answered", skip: map[int]bool{1: true}, want: "[[0 2 4] [1 5]]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := dispatch.NewRounds(eventsOf("a", "a", "b", "a", "c", "b"))
			var rounds [][]int
			for round := r.Next(); len(round) > 0; round = r.Next() {
				rounds = append(rounds, round)
				for _, i := range round {
					switch {
					case tc.skip[i]:
					case tc.fail[i]:
						r.Set(i, dispatch.Result{Outcome: dispatch.Retryable})
					default:
						r.Set(i, dispatch.Result{Outcome: dispatch.Delivered})
					}
				}
			}
			if got := fmt.Sprint(rounds); got != tc.want {
				t.Errorf("rounds %s, want %s", got, tc.want)
			}
		})
	}
}

// TestRoundsStopAtTheFailedEvent: a failure recorded for an event before
// its turn (a message refused while it was built) stops its aggregate at
// that event: the events before it still go, the ones after do not; other
// aggregates are untouched. Results keep successes a prefix.
func TestRoundsStopAtTheFailedEvent(t *testing.T) {
	t.Parallel()
	r := dispatch.NewRounds(eventsOf("a", "b", "a", "a", "b"))
	r.Set(2, dispatch.Result{Outcome: dispatch.Permanent})
	var stopped []bool
	for i := range 5 {
		stopped = append(stopped, r.Stopped(i))
	}
	if got := fmt.Sprint(stopped); got != "[false false true true false]" {
		t.Errorf("stopped %s, want [false false true true false]", got)
	}
	r.Set(0, dispatch.Result{Outcome: dispatch.Delivered})
	r.Set(1, dispatch.Result{Outcome: dispatch.Retryable})
	r.Set(3, dispatch.Result{Outcome: dispatch.Delivered}) // the destination took it anyway
	r.Set(4, dispatch.Result{Outcome: dispatch.Delivered})
	want := []dispatch.Outcome{dispatch.Delivered, dispatch.Retryable, dispatch.Permanent, dispatch.NotAttempted, dispatch.NotAttempted}
	for i, res := range r.Results() {
		if res.Outcome != want[i] {
			t.Errorf("event #%d: %s, want %s", i, res.Outcome, want[i])
		}
	}
}

// TestRoundsParallel: each aggregate in order, stopped at its first
// failure (its later events skipped, never sent), other aggregates sent in
// full; a Duplicate goes on like a delivery.
func TestRoundsParallel(t *testing.T) {
	t.Parallel()
	evs := eventsOf("a", "b", "a", "c", "a", "b", "c")
	answer := map[int64]dispatch.Outcome{1: dispatch.Delivered, 2: dispatch.Duplicate, 3: dispatch.Retryable,
		4: dispatch.Permanent, 5: dispatch.Delivered, 6: dispatch.Delivered, 7: dispatch.Delivered}
	var mu sync.Mutex
	sent := map[string][]int64{}
	var skipped []int
	r := dispatch.NewRounds(evs)
	r.Parallel(context.Background(), make(chan struct{}, 2), func(i int) dispatch.Result {
		mu.Lock()
		defer mu.Unlock()
		sent[evs[i].AggregateID] = append(sent[evs[i].AggregateID], evs[i].ID)
		return dispatch.Result{Outcome: answer[evs[i].ID]}
	}, func(i int) {
		mu.Lock()
		defer mu.Unlock()
		skipped = append(skipped, i)
	})
	if got := fmt.Sprint(sent["a"], sent["b"], sent["c"]); got != "[1 3] [2 6] [4]" {
		t.Errorf("sent a, b, c: %s, want [1 3] [2 6] [4]", got)
	}
	if slices.Sort(skipped); fmt.Sprint(skipped) != "[4 6]" {
		t.Errorf("skipped %v, want [4 6]", skipped)
	}
	want := []dispatch.Outcome{dispatch.Delivered, dispatch.Duplicate, dispatch.Retryable, dispatch.Permanent,
		dispatch.NotAttempted, dispatch.Delivered, dispatch.NotAttempted}
	for i, res := range r.Results() {
		if res.Outcome != want[i] {
			t.Errorf("event #%d: %s, want %s", i, res.Outcome, want[i])
		}
	}
}

// TestRoundsParallelCancelled: with ctx ended and no free slot, no event
// is sent and every one is skipped.
func TestRoundsParallelCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	evs := eventsOf("a", "b", "a")
	slots := make(chan struct{}, 1)
	slots <- struct{}{} // held by another batch
	skipped := 0
	r := dispatch.NewRounds(evs)
	r.Parallel(ctx, slots, func(i int) dispatch.Result {
		t.Errorf("event #%d sent after ctx ended", i)
		return dispatch.Result{}
	}, func(int) { skipped++ })
	if skipped != 3 {
		t.Errorf("skipped %d, want 3", skipped)
	}
}
