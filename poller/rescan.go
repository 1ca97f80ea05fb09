package poller

import "time"

const (
	// rescanEvery is how often a pass of the slow rescan below the cursor
	// starts (Poller.rescanEvery; tests shorten it).
	rescanEvery = 5 * time.Minute
	// rescanFirst, rescanMin and rescanSpan are the ids of a pass's first
	// step, and the least and most of any step.
	rescanFirst = 5_000
	rescanMin   = 500
	rescanSpan  = 50_000
	// stepTarget is the duration a step's span adapts to.
	stepTarget = 2 * time.Millisecond
	// stepSpacing: after a step that took d, the next starts no sooner
	// than stepSpacing × d later, idle or not.
	stepSpacing = 20
	// maxStepPause caps that pause: a step that waited on a lock or a
	// stalled server measures the stall, not the span's cost.
	maxStepPause = rescanEvery / 30
	// rescanPause: while reads find rows, at most one step per this.
	rescanPause = time.Second
)

// rescanPacer paces the slow rescan below the cursor, which finds rows
// that re-entered the pending set there (set pending again by hand, a
// late commit no gap watches). A pass covers (0, to] in steps that run in
// the read loop, so each is paced by its own cost: none sooner than
// stepSpacing times the last one's duration after it (at most
// maxStepPause), and the ids per step adapt to about stepTarget, so the
// reads it shares the loop with are never held for long whatever the
// history. A pass starts at term start and every rescanEvery.
type rescanPacer struct {
	lo, to int64         // (lo, to] left to look at
	at     time.Time     // the last pass started
	stepAt time.Time     // the last step ended
	span   int64         // ids the next step covers (0: rescanFirst)
	last   time.Duration // the last step's duration
}

// passing says whether a pass has ids left.
func (s *rescanPacer) passing() bool { return s.lo < s.to }

// startEvery starts a pass over (0, to] when none runs and rescanEvery
// (every) has passed since the last began.
func (s *rescanPacer) startEvery(now time.Time, every time.Duration, to int64) {
	if !s.passing() && now.Sub(s.at) >= every {
		s.begin(to, now)
	}
}

// begin starts a pass over (0, to] timed from now: the next periodic pass
// starts every after it.
func (s *rescanPacer) begin(to int64, now time.Time) {
	s.lo, s.to, s.at = 0, to, now
}

// pass starts a pass over (0, to] that leaves the periodic timer as it is.
func (s *rescanPacer) pass(to int64) { s.lo, s.to = 0, to }

// due returns the next step's ids, (lo, hi], when one may run now: at once
// on an idle read, otherwise at most every rescanPause.
func (s *rescanPacer) due(now time.Time, idle bool) (lo, hi int64, ok bool) {
	since := now.Sub(s.stepAt)
	if !s.passing() || since < min(stepSpacing*s.last, maxStepPause) || (!idle && since < rescanPause) {
		return 0, 0, false
	}
	if s.span == 0 {
		s.span = rescanFirst
	}
	return s.lo, min(s.lo+s.span, s.to), true
}

// took records a step over (lo, hi] that ran from start to end, and
// adapts the next step's span to its cost.
func (s *rescanPacer) took(hi int64, start, end time.Time) {
	s.stepAt, s.last = end, end.Sub(start)
	switch {
	case s.last > 2*stepTarget:
		s.span = max(s.span/2, rescanMin)
	case s.last < stepTarget/2:
		s.span = min(s.span*2, rescanSpan)
	}
	s.lo = hi
}
