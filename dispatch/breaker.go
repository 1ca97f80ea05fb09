package dispatch

import (
	"cmp"
	"context"
	"log/slog"
	"sync"
	"time"
)

// Defaults of BreakerConfig; config's dispatch.breaker.* defaults are these.
const (
	DefaultBreakerFailures   = 5               // consecutive destination failures that open the circuit
	DefaultBreakerProbeEvery = 5 * time.Second // time between probes while open
)

// maxCharged bounds the ids a breaker remembers of events charged a failure
// in the streak that opened it (Recovered); beyond it they wait out their
// own backoff.
const maxCharged = 10000

// BreakerConfig tunes a Breaker. Zero fields get the defaults.
type BreakerConfig struct {
	// Failures is how many different aggregates whose sends failed with
	// the destination's own failures (Retryable results: connection errors,
	// timeouts, 5xx, 429, a webhook's answers about the destination such as
	// 401 or 404), one after another with no success between, open
	// the circuit; a success or a row's own Permanent answer resets the
	// count. Counting aggregates, not sends: a few rows that keep failing
	// for their own reasons (a 500 to their payload) while nothing else is
	// sent retry, count attempts and dead-letter as usual. Negative: the
	// circuit never opens.
	Failures int
	// ProbeEvery is the time between probes while open.
	ProbeEvery time.Duration
	// Log gets one line per transition (WARN opened, INFO closed); nil: none.
	Log *slog.Logger
	// OnChange is told every transition and every failed probe (the state
	// after it), from the goroutine that saw it. May be nil; must be cheap.
	OnChange func(BreakerState)
}

// BreakerState is a breaker's state as status shows it.
type BreakerState struct {
	Destination string    `json:"destination"`
	Open        bool      `json:"open"`
	Paused      bool      `json:"paused,omitempty"`     // an operator paused it (SetPaused)
	Since       time.Time `json:"since,omitzero"`       // opened at
	LastError   string    `json:"last_error,omitempty"` // the failure that opened it, or the last failed probe's
}

// Breaker is a circuit breaker around one destination's sink. While the
// destination itself fails (Retryable results not cut by the caller's
// deadline, for Failures different aggregates in a row) it is open: Send sends nothing and answers
// NotAttempted, so no event is charged an attempt, except one probe event
// every ProbeEvery. The sends of a batch in flight when it opens stop (the
// wrapped sink sees the batch's trust deadline passed), and a failed probe,
// like every failure that arrives while open, is answered NotAttempted too.
// The first success (or a row's own Permanent answer: the destination
// answered) closes it. The ids of the events charged a failure in the
// streak that opened it are kept (up to maxCharged) and handed out once it
// has closed (Recovered), so the caller can make them due at once.
//
// A paused destination (SetPaused: an operator's pause) is held the same
// way, without probes, until it is resumed.
//
// Send may be called from several goroutines at once, as the wrapped sink allows.
type Breaker struct {
	name string
	sink Sink
	cfg  BreakerConfig

	mu        sync.Mutex
	paused    bool               // an operator's pause: held, no probes
	failing   map[Aggregate]bool // aggregates failed since the last success, while closed
	open      bool               // no sends but probes
	since     time.Time          // opened at
	lastErr   string
	probing   bool               // a probe is in flight
	nextProbe time.Time          // while open
	charged   []int64            // events charged a failure during the current streak
	probed    map[Aggregate]bool // aggregates whose probe failed in this outage (probeIndex)
	recovered []int64            // charged events of outages since closed, not yet handed out
}

// NewBreaker wraps the sink of destination name.
func NewBreaker(name string, sink Sink, cfg BreakerConfig) *Breaker {
	cfg.Failures = cmp.Or(cfg.Failures, DefaultBreakerFailures)
	cfg.ProbeEvery = cmp.Or(cfg.ProbeEvery, DefaultBreakerProbeEvery)
	return &Breaker{name: name, sink: sink, cfg: cfg, failing: map[Aggregate]bool{}, probed: map[Aggregate]bool{}}
}

// Capabilities implements Sink: the wrapped sink's.
func (b *Breaker) Capabilities() Capabilities { return b.sink.Capabilities() }

// Close closes the wrapped sink if it holds something.
func (b *Breaker) Close() error {
	if c, ok := b.sink.(interface{ Close() error }); ok {
		return c.Close()
	}
	return nil
}

// State is the breaker's state now.
func (b *Breaker) State() BreakerState {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state()
}

// state: mu held.
func (b *Breaker) state() BreakerState {
	s := BreakerState{Destination: b.name, Open: b.open, Paused: b.paused}
	if b.open {
		s.Since, s.LastError = b.since, b.lastErr
	}
	return s
}

// isHeld: open or paused.
func (b *Breaker) isHeld() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.open || b.paused
}

// Holds reports whether an event sent now would not be sent: open, and no
// probe due.
func (b *Breaker) Holds(Event) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.paused || b.open && (b.probing || time.Now().Before(b.nextProbe))
}

// SetPaused holds every event (paused) or lets them go again.
func (b *Breaker) SetPaused(paused bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.paused = paused
}

// Recovered hands out, once, the ids of the events charged a failure in the
// streaks that opened circuits since closed.
func (b *Breaker) Recovered() []int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	ids := b.recovered
	b.recovered = nil
	return ids
}

// Send implements Sink.
func (b *Breaker) Send(ctx context.Context, batch Batch) []Result {
	b.mu.Lock()
	probe := false
	if b.paused {
		b.mu.Unlock()
		return b.hold(batch, 0)
	}
	if b.open {
		if b.probing || time.Now().Before(b.nextProbe) || len(batch.Events) == 0 {
			b.mu.Unlock()
			return b.hold(batch, 0)
		}
		b.probing, probe = true, true
	}
	b.mu.Unlock()
	if probe {
		return b.probe(ctx, batch)
	}
	var mu sync.Mutex
	judged := make([]Result, len(batch.Events)) // each event's result, judged once
	seen := make([]bool, len(batch.Events))
	final := func(i int, r Result) Result {
		mu.Lock()
		defer mu.Unlock()
		if !seen[i] {
			judged[i], seen[i] = b.judge(r, batch.Events[i], false), true
		}
		return judged[i]
	}
	inner := batch
	// Once open or paused, the wrapped sink starts no further send of this batch: its
	// trust deadline has passed, as far as it can tell.
	inner.Until = func() time.Time {
		if b.isHeld() {
			return time.Time{}
		}
		return batch.Until()
	}
	inner.Done = func(i int, r Result) {
		if i >= 0 && i < len(judged) {
			batch.done(i, final(i, r))
		}
	}
	res := b.sink.Send(ctx, inner)
	if len(res) != len(batch.Events) {
		return res // a sink that breaks its contract: the caller trusts none of it
	}
	out := make([]Result, len(res))
	for i, r := range res {
		out[i] = final(i, r)
	}
	return out
}

// probe sends one event of batch (probeIndex) and answers the others
// NotAttempted. Done hears each aggregate's results in its order, as from
// any sink: the other aggregates' at once, the probe's aggregate's later
// events only after the probe's own result (a caller that took a later
// event's NotAttempted first would count the aggregate finished with the
// probe still unanswered, and send the probe's event again).
func (b *Breaker) probe(ctx context.Context, batch Batch) []Result {
	p := b.probeIndex(batch.Events)
	agg := batch.Events[p].Aggregate()
	out := make([]Result, len(batch.Events))
	for i := range out {
		if batch.Events[i].Aggregate() != agg {
			batch.done(i, out[i])
		}
	}
	one := batch
	one.Events = batch.Events[p : p+1]
	var once sync.Once
	final := func(r Result) {
		once.Do(func() {
			out[p] = b.judge(r, batch.Events[p], true)
			batch.done(p, out[p])
		})
	}
	one.Done = func(_ int, r Result) { final(r) }
	res := b.sink.Send(ctx, one)
	if len(res) != 1 {
		res = []Result{{Outcome: NotAttempted}}
	}
	final(res[0])
	for i := p + 1; i < len(out); i++ {
		if batch.Events[i].Aggregate() == agg {
			batch.done(i, out[i])
		}
	}
	return out
}

// probeIndex picks the probe: the first event of the first aggregate of
// events that no failed probe of this outage tried, so one event the
// destination fails for its own reasons (an answer of 500 to that payload)
// cannot keep the circuit open while others would go; once every
// aggregate of the batch was tried, they are tried again.
func (b *Breaker) probeIndex(events []Event) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, ev := range events {
		if !b.probed[ev.Aggregate()] {
			return i
		}
	}
	clear(b.probed)
	return 0
}

// hold answers every event of batch from index from on NotAttempted (told
// to Done too) and returns the results.
func (b *Breaker) hold(batch Batch, from int) []Result {
	out := make([]Result, len(batch.Events))
	for i := from; i < len(out); i++ {
		batch.done(i, out[i])
	}
	return out
}

// judge records the result r of event ev and returns what the caller is
// told: a destination failure while open, or of a probe, becomes
// NotAttempted. probe: r is the probe's (its end clears probing).
// OnChange hears of a transition after the lock is released, so it may
// read the breaker.
func (b *Breaker) judge(r Result, ev Event, probe bool) Result {
	out, change := b.record(r, ev, probe)
	if change != nil && b.cfg.OnChange != nil {
		b.cfg.OnChange(*change)
	}
	return out
}

// record is judge under the lock: it updates the breaker with r and
// returns the caller's result and the state to report (nil: nothing to
// report).
func (b *Breaker) record(r Result, ev Event, probe bool) (Result, *BreakerState) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if probe {
		b.probing = false
	}
	switch {
	case r.Outcome == Delivered || r.Outcome == Duplicate || r.Outcome == Permanent:
		return r, b.answered()
	case r.Outcome != Retryable || r.Cut:
		return r, nil // not the destination's answer
	}
	b.lastErr = errText(r.Err)
	if b.open {
		return Result{Outcome: NotAttempted}, b.failedWhileOpen(ev, probe)
	}
	return b.countFailure(r, ev)
}

// answered ends the failure streak: the destination answered. An open
// circuit closes and reports its new state.
func (b *Breaker) answered() *BreakerState {
	var change *BreakerState
	if b.open {
		change = b.closeCircuit()
	}
	clear(b.failing)
	b.charged = nil
	return change
}

// closeCircuit closes the open circuit and queues the events its streak
// charged for Recovered.
func (b *Breaker) closeCircuit() *BreakerState {
	b.open = false
	b.recovered = append(b.recovered, b.charged...)
	clear(b.probed)
	s := b.state()
	if b.cfg.Log != nil {
		b.cfg.Log.Info("circuit closed", "destination", b.name, "open_ms", time.Since(b.since).Milliseconds())
	}
	return &s
}

// failedWhileOpen takes a destination failure that arrives while open. A
// failed probe schedules the next one and marks its aggregate probed
// (probeIndex tries another next), and its state is reported; any other
// failure changes nothing.
func (b *Breaker) failedWhileOpen(ev Event, probe bool) *BreakerState {
	if !probe {
		return nil
	}
	b.nextProbe = time.Now().Add(b.cfg.ProbeEvery)
	if len(b.probed) < maxCharged {
		b.probed[ev.Aggregate()] = true
	}
	s := b.state()
	return &s
}

// countFailure adds ev's aggregate to the streak of a closed circuit. Below
// Failures aggregates the caller gets r and ev is charged; at Failures the
// circuit opens and the caller gets NotAttempted.
func (b *Breaker) countFailure(r Result, ev Event) (Result, *BreakerState) {
	if len(b.failing) < maxCharged {
		b.failing[ev.Aggregate()] = true
	}
	if b.cfg.Failures < 0 || len(b.failing) < b.cfg.Failures {
		if len(b.charged) < maxCharged {
			b.charged = append(b.charged, ev.ID)
		}
		return r, nil
	}
	return Result{Outcome: NotAttempted}, b.openCircuit()
}

// openCircuit opens the circuit: no sends but a probe every ProbeEvery.
func (b *Breaker) openCircuit() *BreakerState {
	b.open, b.since, b.nextProbe = true, time.Now(), time.Now().Add(b.cfg.ProbeEvery)
	s := b.state()
	if b.cfg.Log != nil {
		b.cfg.Log.Warn("circuit opened", "destination", b.name, "failures", len(b.failing), "error", b.lastErr)
	}
	return &s
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// Holds reports whether sink would hold ev back now (its destination's
// circuit is open and no probe is due): a Breaker, or a Router over
// Breakers, says so; any other sink never holds.
func Holds(sink Sink, ev Event) bool {
	h, ok := sink.(interface{ Holds(Event) bool })
	return ok && h.Holds(ev)
}

// Recovered hands out, once, the ids of events charged a failure in the
// streaks that opened circuits of sink (a Breaker, or a Router over
// Breakers) since closed: they may be made due at once.
func Recovered(sink Sink) []int64 {
	if r, ok := sink.(interface{ Recovered() []int64 }); ok {
		return r.Recovered()
	}
	return nil
}

// Pause holds the destinations of sink (a Breaker, or a Router over
// Breakers) that paused names, and lets the others go.
func Pause(sink Sink, paused func(destination string) bool) {
	if p, ok := sink.(interface{ Pause(func(string) bool) }); ok {
		p.Pause(paused)
	}
}

// Pause implements dispatch.Pause for its destination.
func (b *Breaker) Pause(paused func(destination string) bool) { b.SetPaused(paused(b.name)) }
