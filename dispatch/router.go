package dispatch

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync"
	"time"
)

// ErrNoRoute is the failure of an event that no route matches when there is
// no destination named DefaultDestination: it is Permanent (dead-lettered at
// once) and its text is the row's last_error.
var ErrNoRoute = errors.New("no route")

// DefaultDestination is the destination an event no route matches goes to.
const DefaultDestination = "default"

// Destination is a named sink.
type Destination struct {
	Name string
	Sink Sink
}

// Route sends the events it matches to the destination To. A matcher is a
// glob (Glob); an empty one matches every value.
type Route struct {
	AggregateType string
	EventType     string
	To            string
}

// Glob is a compiled pattern: path.Match syntax ('*' any run of
// characters, '?' one character, '[...]' a class, '\' escapes), except that
// '/' is an ordinary character ('*' matches across it): aggregate and event
// types are not paths.
type Glob struct{ pattern string }

// slash stands for '/' while matching: Postgres text never holds a NUL, so
// no value can contain it.
const slash = "\x00"

// ParseGlob checks a pattern; an empty pattern matches everything.
func ParseGlob(pattern string) (Glob, error) {
	if strings.Contains(pattern, slash) {
		return Glob{}, errors.New("a pattern may not hold a NUL character")
	}
	p := strings.ReplaceAll(pattern, "/", slash)
	if _, err := path.Match(p, ""); err != nil {
		return Glob{}, fmt.Errorf("invalid glob %q (use * and ?, [a-z] classes, \\ to escape): %w", pattern, err)
	}
	return Glob{pattern: p}, nil
}

// Match reports whether v matches the pattern.
func (g Glob) Match(v string) bool {
	if g.pattern == "" || g.pattern == "*" {
		return true
	}
	ok, _ := path.Match(g.pattern, strings.ReplaceAll(v, "/", slash)) // checked by ParseGlob
	return ok
}

// Router is a Sink that sends each event to one of several destinations:
// the first route that matches it, else DefaultDestination, else nowhere
// (Permanent, ErrNoRoute).
//
// Order: one aggregate's events keep id order across destinations. An
// aggregate's events in a batch form runs of consecutive events bound for
// the same destination; a run is sent only once every event of the run
// before it has been delivered (a delivery's result arrives through
// Batch.Done, or when the destination's Send returns), and after a failure
// the aggregate's later runs are NotAttempted. So, per aggregate, the
// successes of the combined result are a prefix, as for any Sink. Runs of
// different aggregates go to their destinations together (one Send per
// destination with whatever is ready), and each destination's Send may run
// while others are in flight (several per destination when results arrive
// one by one): no aggregate waits for an unrelated slow one.
//
// Batch.Done is told each event's result once, as soon as it is final.
// Send may be called from several goroutines at once if the destinations'
// sinks allow it (every sink of this package does).
type Router struct {
	dests []Destination
	table *Routes
}

// Routes is the routing table alone, without sinks: which destination an
// event of an aggregate type and event type goes to. Router uses it to
// send; the operator controls use it to select a destination's rows.
type Routes struct {
	names    []string
	routes   []route
	fallback int // index into names of DefaultDestination; -1 when there is none
}

type route struct {
	aggregateType, eventType Glob
	to                       int
}

// NewRoutes builds a routing table over the destinations named names.
// Every route's To must be one of names, and its patterns must parse
// (ParseGlob); names are unique.
func NewRoutes(names []string, routes []Route) (*Routes, error) {
	t := &Routes{names: slices.Clone(names), fallback: -1}
	index := map[string]int{}
	for i, n := range names {
		if _, dup := index[n]; dup {
			return nil, fmt.Errorf("destination %q is named twice", n)
		}
		index[n] = i
	}
	if i, ok := index[DefaultDestination]; ok {
		t.fallback = i
	}
	for n, rt := range routes {
		to, ok := index[rt.To]
		if !ok {
			return nil, fmt.Errorf("route %d: unknown destination %q", n, rt.To)
		}
		at, err := ParseGlob(rt.AggregateType)
		if err != nil {
			return nil, fmt.Errorf("route %d: aggregate_type: %w", n, err)
		}
		et, err := ParseGlob(rt.EventType)
		if err != nil {
			return nil, fmt.Errorf("route %d: event_type: %w", n, err)
		}
		t.routes = append(t.routes, route{aggregateType: at, eventType: et, to: to})
	}
	return t, nil
}

// Names are the destinations' names, in the order given.
func (t *Routes) Names() []string { return slices.Clone(t.names) }

// index returns the index of the destination of an event of aggregateType
// and eventType: the first route that matches, else DefaultDestination;
// -1 when there is none.
func (t *Routes) index(aggregateType, eventType string) int {
	for _, rt := range t.routes {
		if rt.aggregateType.Match(aggregateType) && rt.eventType.Match(eventType) {
			return rt.to
		}
	}
	return t.fallback
}

// Route names the destination of an event of aggregateType and
// eventType, "" when none.
func (t *Routes) Route(aggregateType, eventType string) string {
	if i := t.index(aggregateType, eventType); i >= 0 {
		return t.names[i]
	}
	return ""
}

// NewRouter builds a router. Every route's To must name one of dests, and
// its patterns must parse (ParseGlob); names are unique.
func NewRouter(dests []Destination, routes []Route) (*Router, error) {
	names := make([]string, len(dests))
	for i, d := range dests {
		names[i] = d.Name
	}
	table, err := NewRoutes(names, routes)
	if err != nil {
		return nil, err
	}
	for _, d := range dests {
		if d.Sink == nil {
			return nil, fmt.Errorf("destination %q has no sink", d.Name)
		}
	}
	return &Router{dests: dests, table: table}, nil
}

// Destinations are the router's destinations, in the order given.
func (r *Router) Destinations() []Destination { return slices.Clone(r.dests) }

// route returns the index of ev's destination, -1 when there is none.
func (r *Router) route(ev Event) int { return r.table.index(ev.AggregateType, ev.EventType) }

// DestinationOf names the destination ev goes to, "" when none.
func (r *Router) DestinationOf(ev Event) string { return r.table.Route(ev.AggregateType, ev.EventType) }

// DestinationOf names the destination sink sends ev to: the choice of a
// sink that routes (a Router, or a wrapper of one that has the same
// method), or DefaultDestination for any other sink; "" when a router has
// none for it.
func DestinationOf(sink Sink, ev Event) string {
	if r, ok := sink.(interface{ DestinationOf(Event) string }); ok {
		return r.DestinationOf(ev)
	}
	return DefaultDestination
}

// Holds implements the circuit check (dispatch.Holds) for ev's destination.
func (r *Router) Holds(ev Event) bool {
	i := r.route(ev)
	return i >= 0 && Holds(r.dests[i].Sink, ev)
}

// Pause tells its destinations (dispatch.Pause).
func (r *Router) Pause(paused func(destination string) bool) {
	for _, d := range r.dests {
		Pause(d.Sink, paused)
	}
}

// Recovered gathers its destinations' (dispatch.Recovered).
func (r *Router) Recovered() []int64 {
	var ids []int64
	for _, d := range r.dests {
		ids = append(ids, Recovered(d.Sink)...)
	}
	return ids
}

// Capabilities implements Sink: MaxBatch is the smallest non-zero of the
// destinations' (a batch fits each of them); DedupeWindow the smallest of
// theirs, 0 if any has none (what holds for every event); Parallel the sum
// of theirs (each per-event destination has slots of its own); Ordering
// says how order is kept across destinations and within each. Asked anew
// each time: a sink may learn its own from its server (NATS).
func (r *Router) Capabilities() Capabilities {
	var c Capabilities
	var within []string
	for i, d := range r.dests {
		dc := d.Sink.Capabilities()
		if dc.MaxBatch > 0 && (c.MaxBatch == 0 || dc.MaxBatch < c.MaxBatch) {
			c.MaxBatch = dc.MaxBatch
		}
		if i == 0 || dc.DedupeWindow < c.DedupeWindow {
			c.DedupeWindow = dc.DedupeWindow
		}
		c.Parallel += dc.Parallel
		within = append(within, d.Name+": "+dc.Ordering)
	}
	c.Ordering = "per aggregate across destinations (an aggregate's event waits for the delivery of its earlier ones, wherever they went); within each destination: " +
		strings.Join(within, "; ")
	return c
}

// Close closes the destinations' sinks that hold something.
func (r *Router) Close() error {
	var errs []error
	for _, d := range r.dests {
		if c, ok := d.Sink.(interface{ Close() error }); ok {
			if err := c.Close(); err != nil {
				errs = append(errs, fmt.Errorf("destination %s: %w", d.Name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// Send implements Sink (see Router for the order it keeps).
func (r *Router) Send(ctx context.Context, b Batch) []Result {
	s := &routing{r: r, b: b, out: make([]Result, len(b.Events)), answered: make([]bool, len(b.Events)),
		aggOf: make([]int, len(b.Events)), dest: make([]int, len(b.Events)),
		ready: make([][]int, len(r.dests)), kick: make(chan struct{}, 1)}
	for i, ev := range b.Events {
		s.dest[i] = r.route(ev)
	}
	s.mu.Lock()
	for a, idx := range byAggregate(b.Events) {
		for _, i := range idx {
			s.aggOf[i] = a
		}
		s.aggs = append(s.aggs, &runState{idx: idx})
		s.advance(a)
	}
	s.mu.Unlock()
	s.run(ctx)
	KeepPrefix(b.Events, s.out)
	return s.out
}

// routing is one Send's state.
type routing struct {
	r     *Router
	b     Batch
	aggOf []int // aggregate number of each event
	dest  []int // destination of each event, -1 for none

	mu       sync.Mutex // everything below; Done callbacks come from the sinks' goroutines
	out      []Result
	answered []bool
	aggs     []*runState
	ready    [][]int // per destination, events whose turn has come, not yet sent
	inFlight int     // destination Sends not yet returned
	kick     chan struct{}
}

// runState is one aggregate's progress.
type runState struct {
	idx     []int // its events, in order
	next    int   // position in idx of the first event not yet released
	waiting int   // events of the released run without a result
	stopped bool
}

// advance releases aggregate a's next run (its next events bound for the
// same destination) once the run before it is delivered. mu held.
func (s *routing) advance(a int) {
	st := s.aggs[a]
	if st.stopped || st.waiting > 0 || st.next == len(st.idx) {
		return
	}
	d := s.dest[st.idx[st.next]]
	if d < 0 {
		// Reached in order: the earlier events are delivered.
		i := st.idx[st.next]
		st.next++
		s.answer(i, Result{Outcome: Permanent, Err: &Error{Err: ErrNoRoute, Permanent: true}})
		s.stop(a)
		return
	}
	for st.next < len(st.idx) && s.dest[st.idx[st.next]] == d {
		s.ready[d] = append(s.ready[d], st.idx[st.next])
		st.next++
		st.waiting++
	}
}

// stop ends aggregate a: its events not yet released are NotAttempted. mu held.
func (s *routing) stop(a int) {
	st := s.aggs[a]
	st.stopped = true
	for _, i := range st.idx[st.next:] {
		s.answer(i, Result{Outcome: NotAttempted})
	}
	st.next = len(st.idx)
}

// answer records event i's final result and tells Batch.Done. mu held.
func (s *routing) answer(i int, res Result) {
	if s.answered[i] {
		return
	}
	s.answered[i] = true
	s.out[i] = res
	s.b.done(i, res)
}

// result records a released event's result from its destination and moves
// its aggregate on. mu held.
func (s *routing) result(i int, res Result) {
	if s.answered[i] {
		return
	}
	s.answer(i, res)
	a := s.aggOf[i]
	st := s.aggs[a]
	st.waiting--
	if o := res.Outcome; o != Delivered && o != Duplicate && !st.stopped {
		s.stop(a)
	}
	if st.waiting == 0 {
		s.advance(a)
	}
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// run sends what is ready, one Send per destination, until every event has
// its result. Nothing new starts once ctx has ended or the trust deadline
// has passed: what is ready then stays NotAttempted.
func (s *routing) run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		s.mu.Lock()
		open := ctx.Err() == nil && time.Now().Before(s.b.Until())
		sends := s.take(open)
		s.inFlight += len(sends)
		if len(sends) == 0 && s.inFlight == 0 && !s.anyReady() {
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		for _, idx := range sends {
			wg.Go(func() { s.send(ctx, idx) })
		}
		if len(sends) == 0 {
			<-s.kick // a result came, or a Send returned
		}
	}
}

// take empties the ready lists: while open, it returns each destination's
// events in id order, one Send's worth each; once closed, it answers them
// NotAttempted and returns none. mu held.
func (s *routing) take(open bool) [][]int {
	var sends [][]int
	for d, idx := range s.ready {
		if len(idx) == 0 {
			continue
		}
		s.ready[d] = nil
		if !open {
			for _, i := range idx {
				s.result(i, Result{Outcome: NotAttempted})
			}
			continue
		}
		slices.Sort(idx) // id order, as a Batch promises
		sends = append(sends, idx)
	}
	return sends
}

// anyReady: something was released meanwhile (by a NotAttempted above). mu held.
func (s *routing) anyReady() bool {
	return slices.ContainsFunc(s.ready, func(idx []int) bool { return len(idx) > 0 })
}

// send sends the events at idx (all bound for one destination) and records
// their results: as the destination reports them through Done, and what it
// returns for the others.
func (s *routing) send(ctx context.Context, idx []int) {
	d := s.r.dests[s.dest[idx[0]]]
	events := make([]Event, len(idx))
	for j, i := range idx {
		events[j] = s.b.Events[i]
	}
	res := d.Sink.Send(ctx, Batch{Events: events, Token: s.b.Token, Until: s.b.Until,
		Done: func(j int, r Result) {
			if j < 0 || j >= len(idx) {
				return // a sink that breaks its contract
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			s.result(idx[j], r)
		}})
	s.mu.Lock()
	defer s.mu.Unlock()
	for j, i := range idx {
		r := Result{Outcome: NotAttempted} // a sink that returned too few results: nothing trusted
		if len(res) == len(idx) {
			r = res[j]
		}
		s.result(i, r)
	}
	s.inFlight--
	select {
	case s.kick <- struct{}{}:
	default:
	}
}
