package dispatch_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboxd/outboxd/dispatch"
)

// A breaker opens after Failures consecutive destination failures: those
// before it are charged (Retryable, their ids kept), the one that opens it
// and everything after is NotAttempted; while open one probe goes every
// ProbeEvery (to an aggregate no failed probe tried) and a failed probe is
// NotAttempted; the first success closes it and hands out the charged ids
// once.
func TestBreakerHoldsWhileOpenAndProbes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var down atomic.Bool
		down.Store(true)
		var sends atomic.Int64
		sink := dispatch.PerEvent(func(context.Context, dispatch.Event, int64) error {
			sends.Add(1)
			if down.Load() {
				return &dispatch.Error{Err: errors.New("503 Service Unavailable")}
			}
			return nil
		}, 1, dispatch.Capabilities{}) // one at a time: the order of results is the order of sends
		var states []bool
		b := dispatch.NewBreaker("default", sink, dispatch.BreakerConfig{Failures: 3, ProbeEvery: 5 * time.Second,
			OnChange: func(s dispatch.BreakerState) { states = append(states, s.Open) }})
		ctx := context.Background()

		res := b.Send(ctx, batchOf("a", "b", "c", "d", "e"))
		got := outcomes(res)
		want := []dispatch.Outcome{dispatch.Retryable, dispatch.Retryable, dispatch.NotAttempted, dispatch.NotAttempted, dispatch.NotAttempted}
		if !slices.Equal(got, want) || !b.State().Open {
			t.Fatalf("first batch: %v open %v; want %v and open", got, b.State().Open, want)
		}
		if n := sends.Load(); n != 3 {
			t.Fatalf("%d sends, want 3: none once open", n)
		}
		// Open, no probe due: nothing sent, and Holds says so.
		if res := b.Send(ctx, batchOf("a")); res[0].Outcome != dispatch.NotAttempted || sends.Load() != 3 {
			t.Fatalf("open: %v after %d sends, want NotAttempted and no send", res[0].Outcome, sends.Load())
		}
		if !dispatch.Holds(b, dispatch.Event{}) {
			t.Error("Holds: false while open with no probe due")
		}
		// A probe due: one event goes; failed, it is NotAttempted.
		time.Sleep(5 * time.Second)
		if dispatch.Holds(b, dispatch.Event{}) {
			t.Error("Holds: true with a probe due")
		}
		res = b.Send(ctx, batchOf("a", "b"))
		if got := outcomes(res); !slices.Equal(got, []dispatch.Outcome{dispatch.NotAttempted, dispatch.NotAttempted}) || sends.Load() != 4 {
			t.Fatalf("failed probe: %v after %d sends, want NotAttempted ×2 after 4", got, sends.Load())
		}
		if ids := dispatch.Recovered(b); ids != nil {
			t.Fatalf("Recovered while open: %v", ids)
		}
		// Recovered: the next probe closes it.
		down.Store(false)
		time.Sleep(5 * time.Second)
		res = b.Send(ctx, batchOf("a", "b"))
		// The probe goes to another aggregate than the one whose probe failed.
		if got := outcomes(res); !slices.Equal(got, []dispatch.Outcome{dispatch.NotAttempted, dispatch.Delivered}) || b.State().Open {
			t.Fatalf("probe after recovery: %v open %v, want b's event delivered (a's probe failed), a's held, closed", got, b.State().Open)
		}
		if ids := dispatch.Recovered(b); !slices.Equal(ids, []int64{1, 2}) {
			t.Errorf("Recovered: %v, want the charged [1 2]", ids)
		}
		if ids := dispatch.Recovered(b); ids != nil {
			t.Errorf("Recovered twice: %v", ids)
		}
		if res := b.Send(ctx, batchOf("a", "b")); !slices.Equal(outcomes(res), []dispatch.Outcome{dispatch.Delivered, dispatch.Delivered}) {
			t.Errorf("closed: %v, want all delivered", outcomes(res))
		}
		if !slices.Equal(states, []bool{true, true, false}) {
			t.Errorf("OnChange told %v, want opened, failed probe, closed", states)
		}
	})
}

// A row's own permanent answer is the destination answering: it resets the
// count; the count is of aggregates, not sends; a breaker with Failures < 0
// never opens.
func TestBreakerCountsOnlyDestinationFailures(t *testing.T) {
	fail := func(permanent bool) dispatch.Sink {
		return dispatch.PerEvent(func(_ context.Context, ev dispatch.Event, _ int64) error {
			return &dispatch.Error{Err: errors.New("no"), Permanent: permanent || ev.ID%2 == 0}
		}, 1, dispatch.Capabilities{})
	}
	b := dispatch.NewBreaker("x", fail(false), dispatch.BreakerConfig{Failures: 2})
	b.Send(context.Background(), batchOf("a", "b", "c", "d", "e", "f"))
	if b.State().Open {
		t.Error("opened though every other failure was a row's own 4xx")
	}
	// One aggregate failing again and again is that aggregate's trouble.
	one := dispatch.NewBreaker("x", fail(false), dispatch.BreakerConfig{Failures: 2})
	for range 5 {
		one.Send(context.Background(), batchOf("a"))
	}
	if one.State().Open {
		t.Error("opened for one aggregate's repeated failures")
	}
	never := dispatch.NewBreaker("x", dispatch.PerEvent(func(context.Context, dispatch.Event, int64) error {
		return errors.New("connection refused")
	}, 1, dispatch.Capabilities{}), dispatch.BreakerConfig{Failures: -1})
	never.Send(context.Background(), batchOf("a", "b", "c", "d", "e", "f"))
	if never.State().Open {
		t.Error("Failures -1 opened")
	}
}

func outcomes(res []dispatch.Result) []dispatch.Outcome {
	out := make([]dispatch.Outcome, len(res))
	for i, r := range res {
		out[i] = r.Outcome
	}
	return out
}

// A probe is one send, and Done hears each aggregate's results in its
// order: the probe's result before the NotAttempted of its aggregate's
// later events (a caller counts an aggregate finished at its first event
// not delivered, and would send the probe's event again).
func TestBreakerProbeReportsItsAggregateInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var down atomic.Bool
		down.Store(true)
		var sends atomic.Int64
		sink := dispatch.PerEvent(func(context.Context, dispatch.Event, int64) error {
			sends.Add(1)
			if down.Load() {
				return &dispatch.Error{Err: errors.New("503 Service Unavailable")}
			}
			return nil
		}, 1, dispatch.Capabilities{})
		b := dispatch.NewBreaker("default", sink, dispatch.BreakerConfig{Failures: 1, ProbeEvery: time.Second})
		b.Send(context.Background(), batchOf("x"))
		if !b.State().Open {
			t.Fatal("not open after a failure with Failures 1")
		}
		down.Store(false)
		time.Sleep(time.Second)
		batch := batchOf("a", "b", "a", "a") // ids 1..4; the probe: a's first, id 1
		var told []int64
		batch.Done = func(i int, r dispatch.Result) {
			if batch.Events[i].AggregateID == "a" {
				told = append(told, batch.Events[i].ID)
			}
		}
		before := sends.Load()
		res := b.Send(context.Background(), batch)
		if got := outcomes(res); !slices.Equal(got, []dispatch.Outcome{dispatch.Delivered,
			dispatch.NotAttempted, dispatch.NotAttempted, dispatch.NotAttempted}) || sends.Load() != before+1 || b.State().Open {
			t.Fatalf("probe: %v after %d sends, open %v; want one send, the probe delivered, the rest held, closed",
				got, sends.Load()-before, b.State().Open)
		}
		if !slices.Equal(told, []int64{1, 3, 4}) {
			t.Errorf("Done heard aggregate a's events in the order %v, want [1 3 4]", told)
		}
	})
}
