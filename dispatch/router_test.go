package dispatch_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboxd/outboxd/dispatch"
)

// journal records sends across destinations in one global order.
type journal struct {
	mu    sync.Mutex
	order []sent // every send, in the order made
	byDst map[string][]int64
}

func (j *journal) add(dest string, id int64) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.byDst == nil {
		j.byDst = map[string][]int64{}
	}
	j.order = append(j.order, sent{dest, id})
	j.byDst[dest] = append(j.byDst[dest], id)
}

type sent struct {
	dest string
	id   int64
}

// batchSink sends a batch at once (ignores Done), as the broker sinks do;
// fail gives an event's error.
type batchSink struct {
	name string
	j    *journal
	fail func(dispatch.Event) error
	caps dispatch.Capabilities
}

func (s *batchSink) Capabilities() dispatch.Capabilities { return s.caps }

func (s *batchSink) Send(_ context.Context, b dispatch.Batch) []dispatch.Result {
	out := make([]dispatch.Result, len(b.Events))
	for i, ev := range b.Events {
		if s.fail != nil {
			if err := s.fail(ev); err != nil {
				out[i] = dispatch.Failed(err)
				continue
			}
		}
		s.j.add(s.name, ev.ID)
		out[i].Outcome = dispatch.Delivered
	}
	dispatch.KeepPrefix(b.Events, out)
	return out
}

// perEventSink is a PerEvent sink (calls Done per event) that journals.
func perEventSink(name string, j *journal, fail func(dispatch.Event) error) dispatch.Sink {
	return dispatch.PerEvent(func(_ context.Context, ev dispatch.Event, _ int64) error {
		if fail != nil {
			if err := fail(ev); err != nil {
				return err
			}
		}
		j.add(name, ev.ID)
		return nil
	}, 4, dispatch.Capabilities{Ordering: "per aggregate"})
}

// typedBatch: events 1..n, aggregate and event type per event.
func typedBatch(specs ...[2]string) dispatch.Batch {
	b := dispatch.Batch{Token: 3, Until: func() time.Time { return time.Now().Add(time.Hour) }}
	for i, s := range specs {
		b.Events = append(b.Events, dispatch.Event{ID: int64(i + 1), AggregateType: "order", AggregateID: s[0], EventType: s[1]})
	}
	return b
}

func mustRouter(t *testing.T, dests []dispatch.Destination, routes []dispatch.Route) *dispatch.Router {
	t.Helper()
	r, err := dispatch.NewRouter(dests, routes)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

var hookAndStream = []dispatch.Route{
	{EventType: "*.notify", To: "hook"},
	{EventType: "*.paid", To: "stream"},
}

// Each event reaches its destination only, and an aggregate's event to one
// destination is sent only after its earlier events to the other were: the
// global journal shows each aggregate's ids increasing across both.
func TestRouterKeepsAggregateOrderAcrossDestinations(t *testing.T) {
	j := &journal{}
	r := mustRouter(t, []dispatch.Destination{
		{Name: "hook", Sink: perEventSink("hook", j, nil)},
		{Name: "stream", Sink: &batchSink{name: "stream", j: j}},
	}, hookAndStream)
	var specs [][2]string
	for k := range 30 {
		agg := fmt.Sprint("a", k%5)
		typ := "x.notify"
		if (k/5+k%5)%2 == 1 {
			typ = "x.paid"
		}
		specs = append(specs, [2]string{agg, typ})
	}
	b := typedBatch(specs...)
	res := r.Send(context.Background(), b)
	for i, rs := range res {
		if rs.Outcome != dispatch.Delivered {
			t.Fatalf("event %d: %s (%v)", i+1, rs.Outcome, rs.Err)
		}
	}
	last := map[string]int64{}
	for _, e := range j.order {
		ev := b.Events[e.id-1]
		want := map[bool]string{true: "hook", false: "stream"}[ev.EventType == "x.notify"]
		if e.dest != want {
			t.Errorf("event %d (%s) went to %s", e.id, ev.EventType, e.dest)
		}
		if e.id <= last[ev.AggregateID] {
			t.Errorf("aggregate %s: event %d sent after %d: %v", ev.AggregateID, e.id, last[ev.AggregateID], j.order)
		}
		last[ev.AggregateID] = e.id
	}
	if len(j.order) != len(specs) {
		t.Fatalf("%d sends, want %d: %v", len(j.order), len(specs), j.order)
	}
}

// A failure at one destination stops its aggregate there: its later events
// (to the other destination) are NotAttempted and never sent; other
// aggregates go on. Successes stay a prefix per aggregate.
func TestRouterStopsAnAggregateAtItsFirstFailureAcrossDestinations(t *testing.T) {
	j := &journal{}
	boom := &dispatch.Error{Err: errors.New("503")}
	r := mustRouter(t, []dispatch.Destination{
		{Name: "hook", Sink: perEventSink("hook", j, func(ev dispatch.Event) error {
			if ev.ID == 3 {
				return boom
			}
			return nil
		})},
		{Name: "stream", Sink: &batchSink{name: "stream", j: j}},
	}, hookAndStream)
	//                       1                  2                   3 (fails)           4                  5
	b := typedBatch([2]string{"a", "x.paid"}, [2]string{"b", "x.paid"}, [2]string{"a", "x.notify"}, [2]string{"b", "x.notify"}, [2]string{"a", "x.paid"})
	res := r.Send(context.Background(), b)
	want := []dispatch.Outcome{dispatch.Delivered, dispatch.Delivered, dispatch.Retryable, dispatch.Delivered, dispatch.NotAttempted}
	for i, w := range want {
		if res[i].Outcome != w {
			t.Errorf("event %d: %s, want %s", i+1, res[i].Outcome, w)
		}
	}
	if !errors.Is(res[2].Err, boom) {
		t.Errorf("event 3: error %v, want the destination's", res[2].Err)
	}
	if slices.Contains(j.byDst["stream"], 5) {
		t.Fatalf("event 5 was sent after its aggregate failed: %v", j.order)
	}
}

// Done hears each event's result exactly once, by its index in the
// router's batch, and it is the result Send returns.
func TestRouterForwardsDonePerEvent(t *testing.T) {
	j := &journal{}
	r := mustRouter(t, []dispatch.Destination{
		{Name: "hook", Sink: perEventSink("hook", j, func(ev dispatch.Event) error {
			if ev.ID == 4 {
				return &dispatch.Error{Err: errors.New("400"), Permanent: true}
			}
			return nil
		})},
		{Name: "stream", Sink: &batchSink{name: "stream", j: j}},
	}, hookAndStream)
	b := typedBatch([2]string{"a", "x.notify"}, [2]string{"a", "x.paid"}, [2]string{"b", "x.paid"},
		[2]string{"b", "x.notify"}, [2]string{"b", "x.paid"}, [2]string{"c", "x.notify"})
	var mu sync.Mutex
	told := map[int][]dispatch.Result{}
	b.Done = func(i int, r dispatch.Result) {
		mu.Lock()
		defer mu.Unlock()
		told[i] = append(told[i], r)
	}
	res := r.Send(context.Background(), b)
	for i := range b.Events {
		if len(told[i]) != 1 {
			t.Fatalf("event %d: Done told %d times, want once", i+1, len(told[i]))
		}
		if told[i][0].Outcome != res[i].Outcome {
			t.Errorf("event %d: Done said %s, Send returned %s", i+1, told[i][0].Outcome, res[i].Outcome)
		}
	}
	if res[3].Outcome != dispatch.Permanent || res[4].Outcome != dispatch.NotAttempted || res[1].Outcome != dispatch.Delivered {
		t.Fatalf("results %v", res)
	}
}

// Without a default destination an event no route matches is dead-lettered
// at once ("no route", Permanent) when its turn comes; with one, it goes
// there.
func TestRouterNoRoute(t *testing.T) {
	j := &journal{}
	hook := perEventSink("hook", j, nil)
	b := typedBatch([2]string{"a", "x.notify"}, [2]string{"a", "x.other"}, [2]string{"a", "x.notify"}, [2]string{"b", "x.other"})
	r := mustRouter(t, []dispatch.Destination{{Name: "hook", Sink: hook}}, hookAndStream[:1])
	res := r.Send(context.Background(), b)
	want := []dispatch.Outcome{dispatch.Delivered, dispatch.Permanent, dispatch.NotAttempted, dispatch.Permanent}
	for i, w := range want {
		if res[i].Outcome != w {
			t.Errorf("event %d: %s, want %s", i+1, res[i].Outcome, w)
		}
	}
	if !errors.Is(res[1].Err, dispatch.ErrNoRoute) || res[1].Err.Error() != "no route" || !dispatch.IsPermanent(res[1].Err) {
		t.Errorf("event 2: error %v, want a permanent %q", res[1].Err, "no route")
	}
	if r.DestinationOf(b.Events[1]) != "" {
		t.Errorf("DestinationOf an unrouted event: %q, want empty", r.DestinationOf(b.Events[1]))
	}

	j2 := &journal{}
	r = mustRouter(t, []dispatch.Destination{{Name: "hook", Sink: hook},
		{Name: dispatch.DefaultDestination, Sink: &batchSink{name: "default", j: j2}}}, hookAndStream[:1])
	for i, rs := range r.Send(context.Background(), b) {
		if rs.Outcome != dispatch.Delivered {
			t.Errorf("with a default: event %d %s", i+1, rs.Outcome)
		}
	}
	if fmt.Sprint(slices.Sorted(slices.Values(j2.byDst["default"]))) != "[2 4]" {
		t.Fatalf("default received %v, want [2 4]", j2.byDst["default"])
	}
}

// First match wins; an empty matcher matches anything; '*' crosses '/';
// both matchers must match.
func TestRouterFirstMatchWins(t *testing.T) {
	r := mustRouter(t, []dispatch.Destination{{Name: "a", Sink: dispatch.Noop{}}, {Name: "b", Sink: dispatch.Noop{}}, {Name: "c", Sink: dispatch.Noop{}}},
		[]dispatch.Route{
			{AggregateType: "pay*", EventType: "*.refund", To: "c"},
			{AggregateType: "pay*", To: "a"},
			{EventType: "customer.?otify.*", To: "b"},
			{AggregateType: "x/*", To: "c"},
		})
	for _, c := range []struct{ at, et, want string }{
		{"payment", "payment.refund", "c"},
		{"payment", "payment.made", "a"},
		{"customer", "customer.notify.mail", "b"},
		{"customer", "customer.notify", ""},
		{"x/y/z", "e", "c"},
		{"pay/ment", "e", "a"},
	} {
		if got := r.DestinationOf(dispatch.Event{AggregateType: c.at, EventType: c.et}); got != c.want {
			t.Errorf("(%s, %s): %q, want %q", c.at, c.et, got, c.want)
		}
	}
}

func TestNewRouterRefuses(t *testing.T) {
	noop := []dispatch.Destination{{Name: "a", Sink: dispatch.Noop{}}}
	for _, c := range []struct {
		name   string
		dests  []dispatch.Destination
		routes []dispatch.Route
	}{
		{"unknown destination", noop, []dispatch.Route{{EventType: "x", To: "b"}}},
		{"bad glob", noop, []dispatch.Route{{AggregateType: "[a-", To: "a"}}},
		{"bad escape", noop, []dispatch.Route{{EventType: `x\`, To: "a"}}},
		{"twice", append(noop, noop...), nil},
		{"no sink", []dispatch.Destination{{Name: "a"}}, nil},
	} {
		if _, err := dispatch.NewRouter(c.dests, c.routes); err == nil {
			t.Errorf("%s: accepted", c.name)
		}
	}
}

func TestRouterCapabilities(t *testing.T) {
	j := &journal{}
	r := mustRouter(t, []dispatch.Destination{
		{Name: "a", Sink: &batchSink{j: j, caps: dispatch.Capabilities{MaxBatch: 0, DedupeWindow: time.Minute, Ordering: "A"}}},
		{Name: "b", Sink: &batchSink{j: j, caps: dispatch.Capabilities{MaxBatch: 50, DedupeWindow: 2 * time.Minute, Ordering: "B", Parallel: 64}}},
		{Name: "c", Sink: &batchSink{j: j, caps: dispatch.Capabilities{MaxBatch: 10, DedupeWindow: 3 * time.Minute, Ordering: "C", Parallel: 512}}},
	}, nil)
	c := r.Capabilities()
	if c.MaxBatch != 10 || c.DedupeWindow != time.Minute || c.Parallel != 576 {
		t.Errorf("caps %+v: want MaxBatch 10 (smallest non-zero), DedupeWindow 1m (smallest), Parallel 576 (the sum)", c)
	}
	r = mustRouter(t, []dispatch.Destination{
		{Name: "a", Sink: &batchSink{j: j, caps: dispatch.Capabilities{DedupeWindow: time.Minute}}},
		{Name: "b", Sink: dispatch.Noop{}},
	}, nil)
	if c := r.Capabilities(); c.DedupeWindow != 0 || c.MaxBatch != 0 {
		t.Errorf("caps %+v: want no dedupe window (b has none) and no batch limit", c)
	}
}

// Past the trust deadline nothing is sent: every event NotAttempted.
func TestRouterSendsNothingPastTheDeadline(t *testing.T) {
	j := &journal{}
	r := mustRouter(t, []dispatch.Destination{{Name: "hook", Sink: perEventSink("hook", j, nil)},
		{Name: "stream", Sink: &batchSink{name: "stream", j: j}}}, hookAndStream)
	b := typedBatch([2]string{"a", "x.notify"}, [2]string{"a", "x.paid"}, [2]string{"b", "x.paid"})
	b.Until = func() time.Time { return time.Now().Add(-time.Second) }
	for i, rs := range r.Send(context.Background(), b) {
		if rs.Outcome != dispatch.NotAttempted {
			t.Errorf("event %d: %s", i+1, rs.Outcome)
		}
	}
	if len(j.order) != 0 {
		t.Fatalf("sent past the deadline: %v", j.order)
	}
}

// No barrier: while one aggregate's send hangs at one destination, another
// aggregate's events go back and forth between both destinations to the
// end. If the router waited for the slow aggregate, every goroutine of the
// bubble would block and synctest would report the deadlock.
func TestRouterDoesNotWaitForASlowAggregate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		j := &journal{}
		release := make(chan struct{})
		fastDone := make(chan struct{})
		hook := perEventSink("hook", j, func(ev dispatch.Event) error {
			if ev.AggregateID == "slow" {
				<-release
			}
			return nil
		})
		stream := &batchSink{name: "stream", j: j, fail: func(ev dispatch.Event) error {
			if ev.ID == 5 { // fast's last event
				close(fastDone)
			}
			return nil
		}}
		r := mustRouter(t, []dispatch.Destination{{Name: "hook", Sink: hook}, {Name: "stream", Sink: stream}}, hookAndStream)
		b := typedBatch([2]string{"slow", "x.notify"}, [2]string{"fast", "x.paid"}, [2]string{"fast", "x.notify"},
			[2]string{"slow", "x.paid"}, [2]string{"fast", "x.paid"})
		var res []dispatch.Result
		go func() {
			<-fastDone
			close(release)
		}()
		res = r.Send(context.Background(), b)
		for i, rs := range res {
			if rs.Outcome != dispatch.Delivered {
				t.Errorf("event %d: %s", i+1, rs.Outcome)
			}
		}
	})
}

// DestinationOf: a plain sink is the destination "default"; a router names
// its choice.
func TestDestinationOf(t *testing.T) {
	ev := dispatch.Event{AggregateType: "order", EventType: "order.notify"}
	if got := dispatch.DestinationOf(dispatch.Noop{}, ev); got != dispatch.DefaultDestination {
		t.Errorf("a plain sink: %q", got)
	}
	r := mustRouter(t, []dispatch.Destination{{Name: "hook", Sink: dispatch.Noop{}}}, hookAndStream[:1])
	if got := dispatch.DestinationOf(r, ev); got != "hook" {
		t.Errorf("a router: %q, want hook", got)
	}
}

// doneSink sends a batch's events one by one and reports each through Done
// as it goes, as a sink that learns results one at a time does; before
// sending an event for which hold gives a channel, it waits on it.
type doneSink struct {
	name string
	j    *journal
	hold func(dispatch.Event) chan struct{}
}

func (s *doneSink) Capabilities() dispatch.Capabilities { return dispatch.Capabilities{} }

func (s *doneSink) Send(_ context.Context, b dispatch.Batch) []dispatch.Result {
	out := make([]dispatch.Result, len(b.Events))
	for i, ev := range b.Events {
		if c := s.hold(ev); c != nil {
			<-c
		}
		s.j.add(s.name, ev.ID)
		out[i].Outcome = dispatch.Delivered
		b.Done(i, out[i])
	}
	return out
}

// An aggregate's runs of several events each: the next run is released to
// the other destination only once every event of the run before it was
// delivered, not when the first of them was. Each destination holds the
// second event of its first run; while it is held, nothing later of the
// aggregate may reach the other destination. synctest.Wait returns once
// every goroutine is blocked, so what the journal holds then is all the
// router sent.
func TestRouterReleasesARunOnlyAfterTheWholeRunBeforeIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		j := &journal{}
		hold2, hold4 := make(chan struct{}), make(chan struct{})
		hook := perEventSink("hook", j, func(ev dispatch.Event) error {
			if ev.ID == 2 {
				<-hold2
			}
			return nil
		})
		stream := &doneSink{name: "stream", j: j, hold: func(ev dispatch.Event) chan struct{} {
			if ev.ID == 4 {
				return hold4
			}
			return nil
		}}
		r := mustRouter(t, []dispatch.Destination{{Name: "hook", Sink: hook}, {Name: "stream", Sink: stream}}, hookAndStream)
		//                       1 hook               2 hook (held)          3 stream             4 stream (held)     5 hook
		b := typedBatch([2]string{"a", "x.notify"}, [2]string{"a", "x.notify"}, [2]string{"a", "x.paid"}, [2]string{"a", "x.paid"}, [2]string{"a", "x.notify"})
		var res []dispatch.Result
		finished := make(chan struct{})
		go func() {
			defer close(finished)
			res = r.Send(context.Background(), b)
		}()
		journaled := func() []sent {
			j.mu.Lock()
			defer j.mu.Unlock()
			return slices.Clone(j.order)
		}
		release2, release4 := sync.OnceFunc(func() { close(hold2) }), sync.OnceFunc(func() { close(hold4) })
		expect := func(when, want string) {
			if got := fmt.Sprint(journaled()); got != want {
				release2()
				release4()
				<-finished // the bubble ends only with its goroutines
				t.Fatalf("%s: sent %s, want %s", when, got, want)
			}
		}
		synctest.Wait()
		expect("while event 2 is held at hook", "[{hook 1}]")
		release2()
		synctest.Wait()
		expect("while event 4 is held at stream", "[{hook 1} {hook 2} {stream 3}]")
		release4()
		<-finished
		expect("at the end", "[{hook 1} {hook 2} {stream 3} {stream 4} {hook 5}]")
		for i, rs := range res {
			if rs.Outcome != dispatch.Delivered {
				t.Errorf("event %d: %s", i+1, rs.Outcome)
			}
		}
	})
}

// The routing table alone names an event's destination as the router
// sends it: the first matching route, else "default", else none ("").
func TestRoutesNameTheDestination(t *testing.T) {
	rt, err := dispatch.NewRoutes([]string{"a", "b"}, []dispatch.Route{{AggregateType: "x/*", To: "a"}, {EventType: "e", To: "b"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ agg, ev, want string }{{"x/y/z", "e", "a"}, {"y", "e", "b"}, {"y", "f", ""}} {
		if got := rt.Route(c.agg, c.ev); got != c.want {
			t.Errorf("Route(%q, %q) = %q, want %q", c.agg, c.ev, got, c.want)
		}
	}
	if _, err := dispatch.NewRoutes([]string{"a"}, []dispatch.Route{{AggregateType: "x", To: "c"}}); err == nil {
		t.Error("a route to an unknown destination was accepted")
	}
}
