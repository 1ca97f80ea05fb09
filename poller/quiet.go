package poller

import "time"

// streamGrace is how many fetches in a row may find nothing, after one
// that found rows, before the lead's wait starts to grow (quietWait).
const streamGrace = 4

// quietWait is the lead's wait after a fetch that found nothing. A stream
// has short gaps: for the first streamGrace empty fetches after rows the
// lead keeps reading every millisecond, so an event committed in a gap
// waits about a millisecond, not the 2 or 4 ms a doubling wait would have
// reached; only then does the wait double, 2, 4, 8 ... ms up to
// poll_interval, so an idle relay reads about once a poll_interval. Its
// guarantee: the first streamGrace waits after rows are a millisecond each,
// and no wait exceeds poll_interval.
type quietWait struct {
	empties int           // fetches in a row that found nothing
	last    time.Duration // the wait given after the last of them
}

// rows records a fetch that found rows (or rows held behind an earlier
// id): the next empty fetch starts the grace again.
func (q *quietWait) rows() { q.empties, q.last = 0, 0 }

// next is the wait after one more fetch that found nothing, given the
// ceiling poll.
func (q *quietWait) next(poll time.Duration) time.Duration {
	q.empties++
	d := time.Millisecond
	if q.empties > streamGrace {
		d = 2 * q.last
	}
	q.last = min(max(d, time.Millisecond), poll)
	return q.last
}
