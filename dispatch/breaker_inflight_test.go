package dispatch_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboxd/outboxd/dispatch"
)

// Sends under way when the circuit opens: no further send of the batch
// starts (an aggregate waiting for a slot is held, unsent), nor of another
// batch; a failure that arrives once it is open is not charged
// (NotAttempted, not among the ids Recovered hands out); a success that
// arrives is recorded (Delivered, told to Done as returned) and closes the
// circuit.
func TestBreakerOpeningWithSendsUnderWay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		aggs := []string{"slow1", "slow2", "a", "b", "c", "d"} // ids 1..6; d would be delivered at once
		gates := map[string]chan error{}
		for _, a := range aggs[:5] {
			gates[a] = make(chan error)
		}
		var mu sync.Mutex
		var sent []int64
		sink := dispatch.PerEvent(func(_ context.Context, ev dispatch.Event, _ int64) error {
			mu.Lock()
			sent = append(sent, ev.ID)
			mu.Unlock()
			if g, ok := gates[ev.AggregateID]; ok {
				return <-g
			}
			return nil
		}, 4, dispatch.Capabilities{})
		sentNow := func() []int64 {
			mu.Lock()
			defer mu.Unlock()
			return slices.Sorted(slices.Values(sent))
		}
		b := dispatch.NewBreaker("default", sink, dispatch.BreakerConfig{Failures: 2, ProbeEvery: time.Hour})
		unavailable := &dispatch.Error{Err: errors.New("receiver answered 503"), Status: 503}

		batch := batchOf(aggs...)
		var doneMu sync.Mutex
		told := map[int64]dispatch.Outcome{}
		batch.Done = func(i int, r dispatch.Result) {
			doneMu.Lock()
			defer doneMu.Unlock()
			told[batch.Events[i].ID] = r.Outcome
		}
		var res []dispatch.Result
		finished := make(chan struct{})
		go func() {
			defer close(finished)
			res = b.Send(context.Background(), batch)
		}()
		synctest.Wait() // four slots: slow1, slow2, a, b under way; c waits
		gates["a"] <- unavailable
		synctest.Wait() // a charged; c takes its slot, while closed
		gates["b"] <- unavailable
		synctest.Wait() // b opens it; d takes its slot, while open
		// Errorf, not Fatalf, from here on: the sends under way are let go
		// whatever happens, or the bubble would never end.
		if !b.State().Open {
			t.Error("not open after two aggregates failed")
		}
		if got := sentNow(); !slices.Equal(got, []int64{1, 2, 3, 4, 5}) {
			t.Errorf("sent %v, want [1 2 3 4 5]: d's send started after the circuit opened", got)
		}
		other := b.Send(context.Background(), batchOf("x"))
		if other[0].Outcome != dispatch.NotAttempted || len(sentNow()) != 5 {
			t.Errorf("another batch while open: %v, %d sends; want NotAttempted, nothing more sent", other[0].Outcome, len(sentNow()))
		}
		gates["slow1"] <- unavailable
		gates["c"] <- unavailable
		synctest.Wait()
		if !b.State().Open {
			t.Error("closed by failures that arrived while open")
		}
		gates["slow2"] <- nil
		<-finished

		want := []dispatch.Outcome{dispatch.NotAttempted, dispatch.Delivered, dispatch.Retryable,
			dispatch.NotAttempted, dispatch.NotAttempted, dispatch.NotAttempted}
		if got := outcomes(res); !slices.Equal(got, want) {
			t.Errorf("results %v, want %v: only a charged before it opened; slow1's and c's failures not charged, slow2's success recorded", got, want)
		}
		for i, r := range res {
			if id := batch.Events[i].ID; told[id] != r.Outcome || !hasKey(told, id) {
				t.Errorf("event %d: Done told %v (told: %v), Send returned %v", id, told[id], hasKey(told, id), r.Outcome)
			}
		}
		if b.State().Open {
			t.Error("still open after the success of a send under way")
		}
		if ids := dispatch.Recovered(b); !slices.Equal(ids, []int64{3}) {
			t.Errorf("Recovered %v, want [3]: the one failure charged", ids)
		}
		if got := sentNow(); !slices.Equal(got, []int64{1, 2, 3, 4, 5}) {
			t.Errorf("sent %v, want [1 2 3 4 5]", got)
		}
	})
}

func hasKey[K comparable, V any](m map[K]V, k K) bool {
	_, ok := m[k]
	return ok
}
