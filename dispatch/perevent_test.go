package dispatch_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboxd/outboxd/dispatch"
)

func batchOf(aggs ...string) dispatch.Batch {
	b := dispatch.Batch{Token: 7, Until: func() time.Time { return time.Now().Add(time.Hour) }}
	for i, a := range aggs {
		b.Events = append(b.Events, dispatch.Event{ID: int64(i + 1), AggregateType: "deal", AggregateID: a})
	}
	return b
}

// One aggregate in order, stopped at its first failure (the rest not
// attempted); other aggregates unaffected; results aligned by index.
func TestPerEventStopsAnAggregateAtItsFirstFailure(t *testing.T) {
	var mu sync.Mutex
	sent := map[string][]int64{}
	sink := dispatch.PerEvent(func(_ context.Context, ev dispatch.Event, token int64) error {
		if token != 7 {
			t.Errorf("token %d, want 7", token)
		}
		mu.Lock()
		sent[ev.AggregateID] = append(sent[ev.AggregateID], ev.ID)
		mu.Unlock()
		switch ev.ID {
		case 3:
			return &dispatch.Error{Err: errors.New("503"), RetryAfter: time.Second}
		case 4:
			return &dispatch.Error{Err: errors.New("400"), Permanent: true}
		}
		return nil
	}, 4, dispatch.Capabilities{})
	//                     1    2    3    4    5    6    7
	res := sink.Send(context.Background(), batchOf("a", "b", "a", "c", "a", "b", "c"))
	want := []dispatch.Outcome{dispatch.Delivered, dispatch.Delivered, dispatch.Retryable, dispatch.Permanent,
		dispatch.NotAttempted, dispatch.Delivered, dispatch.NotAttempted}
	for i, w := range want {
		if res[i].Outcome != w {
			t.Errorf("event %d: %s, want %s", i+1, res[i].Outcome, w)
		}
	}
	if res[2].RetryAfter != time.Second || res[2].Cut {
		t.Errorf("event 3: %+v, want RetryAfter 1s and not cut", res[2])
	}
	if fmt.Sprint(sent["a"]) != "[1 3]" || fmt.Sprint(sent["b"]) != "[2 6]" || fmt.Sprint(sent["c"]) != "[4]" {
		t.Fatalf("sent %v: want each aggregate in order, none after its failure", sent)
	}
}

// Aggregates go in parallel, never more than the concurrency at once, and
// the limit holds while more aggregates are queued: each finished send lets
// exactly one more start. synctest.Wait returns once every goroutine of the
// bubble is blocked (senders on release, the sink on its limit), so the
// counts below are what the sink does, not what a scheduler got to so far.
func TestPerEventBoundsConcurrency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const limit, aggregates = 3, 7
		var mu sync.Mutex
		inside, started, peak := 0, 0, 0
		release := make(chan struct{})
		sink := dispatch.PerEvent(func(context.Context, dispatch.Event, int64) error {
			mu.Lock()
			inside++
			started++
			peak = max(peak, inside)
			mu.Unlock()
			<-release
			mu.Lock()
			inside--
			mu.Unlock()
			return nil
		}, limit, dispatch.Capabilities{})
		done := make(chan []dispatch.Result, 1)
		go func() { done <- sink.Send(context.Background(), batchOf("a", "b", "c", "d", "e", "f", "g")) }()
		for finished := 0; finished < aggregates; finished++ {
			synctest.Wait()
			mu.Lock()
			wantStarted := min(limit+finished, aggregates)
			if started != wantStarted || inside != wantStarted-finished {
				t.Errorf("after %d finished: %d started, %d at once; want %d started, %d at once",
					finished, started, inside, wantStarted, wantStarted-finished)
			}
			mu.Unlock()
			release <- struct{}{}
		}
		res := <-done
		if peak != limit {
			t.Errorf("peak %d aggregates at once, want %d", peak, limit)
		}
		for i, r := range res {
			if r.Outcome != dispatch.Delivered {
				t.Errorf("event %d: %s", i+1, r.Outcome)
			}
		}
	})
}

// Past the trust deadline nothing more is sent; a send that outlives it is
// reported Cut, not as the destination's failure.
func TestPerEventHonoursTheTrustDeadline(t *testing.T) {
	var sends atomic.Int32
	deadline := time.Now().Add(50 * time.Millisecond)
	sink := dispatch.PerEvent(func(ctx context.Context, ev dispatch.Event, _ int64) error {
		sends.Add(1)
		<-ctx.Done() // a destination slower than the lease
		return ctx.Err()
	}, 1, dispatch.Capabilities{})
	b := batchOf("a", "a", "b")
	b.Until = func() time.Time { return deadline }
	res := sink.Send(context.Background(), b)
	if res[0].Outcome != dispatch.Retryable || !res[0].Cut {
		t.Fatalf("event 1: %+v, want Retryable and Cut", res[0])
	}
	if res[1].Outcome != dispatch.NotAttempted || res[2].Outcome != dispatch.NotAttempted || sends.Load() != 1 {
		t.Fatalf("after the deadline: %s, %s, %d sends; want nothing more sent", res[1].Outcome, res[2].Outcome, sends.Load())
	}
}

// Each send is bounded by the trust deadline it read: when a renewal moves
// the deadline on during a batch, the later sends get the later deadline,
// and the earlier one bounds only the sends that read it.
func TestPerEventBoundsEachSendByTheDeadlineItRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var deadlines []time.Time
		sink := dispatch.PerEvent(func(ctx context.Context, ev dispatch.Event, _ int64) error {
			d, _ := ctx.Deadline()
			deadlines = append(deadlines, d)
			time.Sleep(40 * time.Millisecond) // longer than the first deadline leaves
			return nil
		}, 1, dispatch.Capabilities{})
		b := batchOf("a", "a", "a")
		b.Until = func() time.Time { return time.Now().Add(50 * time.Millisecond) } // renewed before each send
		res := sink.Send(context.Background(), b)
		for i, r := range res {
			if r.Outcome != dispatch.Delivered {
				t.Errorf("event %d: %+v, want delivered", i+1, r)
			}
		}
		for i, d := range deadlines {
			if want := start.Add(time.Duration(40*i+50) * time.Millisecond); !d.Equal(want) {
				t.Errorf("send %d bounded at +%v, want +%v", i+1, d.Sub(start), want.Sub(start))
			}
		}
	})
}

func TestNoopDeliversEverything(t *testing.T) {
	res := dispatch.Noop{}.Send(context.Background(), batchOf("a", "b"))
	if len(res) != 2 || res[0].Outcome != dispatch.Delivered || res[1].Outcome != dispatch.Delivered {
		t.Fatalf("%+v", res)
	}
}

// Each event's result reaches Batch.Done as soon as it is known: a fast
// aggregate is reported while a slow one is still being sent, and every
// event (NotAttempted ones too) is reported once, with the result Send
// returns.
func TestPerEventReportsEachResultAsItIsKnown(t *testing.T) {
	release := make(chan struct{})
	sink := dispatch.PerEvent(func(_ context.Context, ev dispatch.Event, _ int64) error {
		switch ev.AggregateID {
		case "slow":
			<-release
		case "bad":
			return errors.New("503")
		}
		return nil
	}, 4, dispatch.Capabilities{})
	//                 0       1       2      3      4
	b := batchOf("slow", "fast", "bad", "bad", "fast")
	var mu sync.Mutex
	got := map[int][]dispatch.Result{}
	fastDone := make(chan struct{})
	b.Done = func(i int, r dispatch.Result) {
		mu.Lock()
		defer mu.Unlock()
		got[i] = append(got[i], r)
		if len(got[1]) == 1 && len(got[4]) == 1 && i == 4 {
			close(fastDone)
		}
	}
	done := make(chan []dispatch.Result)
	go func() { done <- sink.Send(context.Background(), b) }()
	select {
	case <-fastDone: // the slow aggregate is still held
	case res := <-done:
		t.Fatalf("Send returned (%v) before the fast aggregate was reported", res)
	}
	close(release)
	res := <-done
	mu.Lock()
	defer mu.Unlock()
	for i, r := range res {
		if len(got[i]) != 1 || got[i][0].Outcome != r.Outcome {
			t.Errorf("event %d: Done saw %v, Send returned %s", i, got[i], r.Outcome)
		}
	}
	if res[3].Outcome != dispatch.NotAttempted {
		t.Errorf("event after a failure: %s, want not attempted", res[3].Outcome)
	}
}

// The concurrency bounds the sink, not one Send: batches in flight at once
// share it.
func TestPerEventBoundsConcurrencyAcrossBatches(t *testing.T) {
	var now, peak atomic.Int32
	release := make(chan struct{})
	sink := dispatch.PerEvent(func(context.Context, dispatch.Event, int64) error {
		n := now.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		<-release
		now.Add(-1)
		return nil
	}, 2, dispatch.Capabilities{})
	done := make(chan []dispatch.Result, 2)
	for range 2 {
		go func() { done <- sink.Send(context.Background(), batchOf("a", "b")) }()
	}
	for peak.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	close(release)
	for range 2 {
		for i, r := range <-done {
			if r.Outcome != dispatch.Delivered {
				t.Fatalf("event %d: %s", i+1, r.Outcome)
			}
		}
	}
	if peak.Load() != 2 {
		t.Fatalf("peak %d aggregates at once over two batches, want 2", peak.Load())
	}
}
