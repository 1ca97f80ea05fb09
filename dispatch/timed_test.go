package dispatch_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/dispatch"
)

type observed struct {
	mu   sync.Mutex
	seen map[string]int
}

func (o *observed) observe(outcome string, took time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.seen[outcome]++
}

// Timed observes each request of a per-event sink once, with its outcome,
// and a batch sink's call once; events never attempted are not observed.
func TestTimedObservesEachSend(t *testing.T) {
	w := dispatch.PerEvent(func(_ context.Context, ev dispatch.Event, _ int64) error {
		if ev.ID == 2 {
			return &dispatch.Error{Err: errors.New("receiver answered 500"), Status: 500}
		}
		return nil
	}, 0, dispatch.Capabilities{})
	o := &observed{seen: map[string]int{}}
	ev := func(id int64, agg string) dispatch.Event {
		e := event()
		e.ID, e.AggregateID = id, agg
		return e
	}
	batch := dispatch.Batch{Events: []dispatch.Event{ev(1, "a"), ev(2, "b"), ev(3, "b"), ev(4, "c")}, Token: 1,
		Until: func() time.Time { return time.Now().Add(time.Minute) }}
	out := dispatch.Timed(w, o.observe).Send(context.Background(), batch)
	if out[2].Outcome != dispatch.NotAttempted {
		t.Fatalf("results %v", out)
	}
	if o.seen[dispatch.SendDelivered] != 2 || o.seen[dispatch.SendRetryable] != 1 || len(o.seen) != 2 {
		t.Fatalf("per-event sink observed %v, want 2 delivered and 1 retryable", o.seen)
	}
	o = &observed{seen: map[string]int{}}
	dispatch.Timed(dispatch.Noop{}, o.observe).Send(context.Background(), batch)
	if o.seen[dispatch.SendDelivered] != 1 || len(o.seen) != 1 {
		t.Fatalf("batch sink observed %v, want its one call", o.seen)
	}
}
