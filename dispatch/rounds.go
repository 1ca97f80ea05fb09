package dispatch

import (
	"context"
	"slices"
	"sync"
)

// Rounds is one batch's sends per aggregate: it holds a Result per event,
// aligned with the batch, and stops an aggregate at its first event that
// is not Delivered or Duplicate. Sinks use it in one of three ways:
//
//   - in batch order (a pipeline, a stream of publishes): skip each event
//     that Stopped reports, Set each result;
//   - in rounds (calls that carry many aggregates): Next gives the next
//     event of every aggregate still going, Set records what came back;
//   - per aggregate (one request per event): Parallel sends each aggregate
//     in order, several aggregates at once.
//
// Results applies the contract whichever way was used: per aggregate,
// successes are a prefix, and every event after the aggregate's first
// failure is NotAttempted. Set and Stop are safe for concurrent use only
// on events of different aggregates that Parallel runs, or under the
// caller's own lock.
type Rounds struct {
	events []Event
	out    []Result
	stopAt map[Aggregate]int // an aggregate's first event that is not delivered; nil until one fails

	groups [][]int // event indexes per aggregate, for Next and Parallel; nil until needed
	pos    []int   // per group, the position of the next event Next gives
	live   []int   // the groups Next still looks at
}

// NewRounds returns the rounds of a batch of events, every event
// NotAttempted.
func NewRounds(events []Event) *Rounds {
	return &Rounds{events: events, out: make([]Result, len(events))}
}

// Stopped reports whether event i's aggregate stopped at i or before it:
// i must not be sent.
func (r *Rounds) Stopped(i int) bool {
	at, ok := r.stopAt[r.events[i].Aggregate()]
	return ok && i >= at
}

// Set records event i's result. A result that is neither Delivered nor
// Duplicate (NotAttempted included) stops its aggregate at i.
func (r *Rounds) Set(i int, res Result) {
	r.out[i] = res
	if !delivered(res) {
		r.Stop(i)
	}
}

// Stop stops event i's aggregate at i, leaving i's result as it is.
func (r *Rounds) Stop(i int) {
	a := r.events[i].Aggregate()
	if at, ok := r.stopAt[a]; ok && at <= i {
		return
	}
	if r.stopAt == nil {
		r.stopAt = map[Aggregate]int{}
	}
	r.stopAt[a] = i
}

// Result is event i's result as recorded so far.
func (r *Rounds) Result(i int) Result { return r.out[i] }

// Next is the next round: for every aggregate still going, its first event
// not given yet, in batch order. An aggregate stops going when Stopped says
// so or when the event Next gave before is not delivered (its result was
// never Set, or Set to a failure). Empty once no aggregate goes on.
func (r *Rounds) Next() []int {
	if r.groups == nil {
		r.groups = byAggregate(r.events)
		r.pos = make([]int, len(r.groups))
		r.live = make([]int, len(r.groups))
		for g := range r.live {
			r.live[g] = g
		}
	}
	var round []int
	live := r.live[:0]
	for _, g := range r.live {
		idx, p := r.groups[g], r.pos[g]
		if p == len(idx) || r.Stopped(idx[p]) || (p > 0 && !delivered(r.out[idx[p-1]])) {
			continue // done: dropped from later rounds
		}
		round = append(round, idx[p])
		r.pos[g]++
		live = append(live, g)
	}
	r.live = live
	slices.Sort(round)
	return round
}

// Parallel sends every aggregate's events in order, one goroutine per
// aggregate, at most cap(slots) aggregates at once (slots may be shared by
// several batches, bounding them together). send is called for an
// aggregate's events one after another until it returns a result that is
// neither Delivered nor Duplicate; the aggregate's later events stay
// NotAttempted and are passed to skip. When ctx ends before an aggregate
// gets a slot, all its events are passed to skip. Parallel returns once
// every goroutine it started has ended.
func (r *Rounds) Parallel(ctx context.Context, slots chan struct{}, send func(i int) Result, skip func(i int)) {
	var wg sync.WaitGroup
	for _, idx := range byAggregate(r.events) {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			for _, i := range idx {
				skip(i) // this aggregate's events stay NotAttempted
			}
			continue
		}
		wg.Go(func() {
			defer func() { <-slots }()
			r.aggregate(idx, send, skip)
		})
	}
	wg.Wait()
}

// aggregate sends the events at idx (one aggregate's, in order) until the
// first that does not go through.
func (r *Rounds) aggregate(idx []int, send func(i int) Result, skip func(i int)) {
	for k, i := range idx {
		r.out[i] = send(i)
		if !delivered(r.out[i]) {
			for _, j := range idx[k+1:] {
				skip(j)
			}
			return
		}
	}
}

// Results are the batch's results, aligned with its events, with the
// contract applied (KeepPrefix).
func (r *Rounds) Results() []Result {
	KeepPrefix(r.events, r.out)
	return r.out
}

// KeepPrefix applies the contract to results a sink collected: per
// aggregate, after its first event that was neither delivered nor a
// duplicate, every later event is NotAttempted, whatever the destination did
// with it (the caller sends it again later; consumers dedupe on the id).
func KeepPrefix(events []Event, out []Result) {
	var stopped map[Aggregate]bool // nil until an event fails
	for i, ev := range events {
		a := ev.Aggregate()
		if stopped[a] {
			out[i] = Result{Outcome: NotAttempted}
			continue
		}
		if !delivered(out[i]) {
			if stopped == nil {
				stopped = map[Aggregate]bool{}
			}
			stopped[a] = true
		}
	}
}

// delivered reports whether r counts as delivered.
func delivered(r Result) bool { return r.Outcome == Delivered || r.Outcome == Duplicate }

// byAggregate groups event indexes by aggregate, each group in event order,
// groups in order of first appearance.
func byAggregate(events []Event) [][]int {
	pos := map[Aggregate]int{}
	var groups [][]int
	for i, ev := range events {
		k := ev.Aggregate()
		g, ok := pos[k]
		if !ok {
			g = len(groups)
			pos[k] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}
