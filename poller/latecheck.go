package poller

import (
	"log/slog"
	"time"

	"github.com/outboxd/outboxd/internal/metrics"
	"github.com/outboxd/outboxd/store"
)

// lateRow is a late commit: row, after a later row of its aggregate (after)
// was dispatched.
type lateRow struct {
	row   store.Row
	after int64
}

// checkedSet is the ids a term's late-commit checks have checked or warned.
// Each check skips an id another one has settled, so a row is warned once
// a term.
type checkedSet map[int64]struct{}

// done says whether id was checked or warned this term.
func (s checkedSet) done(id int64) bool {
	_, ok := s[id]
	return ok
}

// mark records id as checked or warned this term.
func (s *checkedSet) mark(id int64) {
	if *s == nil {
		*s = checkedSet{}
	}
	(*s)[id] = struct{}{}
}

// lateReport warns for and counts late commits. It is safe for concurrent
// use: the walk below the cursor reports off the lead goroutine.
type lateReport struct {
	log *slog.Logger
	m   *metrics.Metrics
}

// late warns for and counts a late row found by the inherited or the
// below-the-cursor check.
func (r lateReport) late(l lateRow) {
	r.m.LateCommits.Inc()
	r.log.Warn("late commit", "aggregate_type", l.row.AggregateType, "aggregate_id", l.row.AggregateID,
		"outbox_id", l.row.ID, "after_id", l.after, "waited_ms", time.Since(l.row.CreatedAt).Milliseconds())
}

// gapCommitted reports a gap that committed after it was given up: a WARN
// and the count when it is late, an INFO when its order held.
func (r lateReport) gapCommitted(id int64, a store.Aggregate, after int64, late bool, waited time.Duration) {
	if !late {
		r.log.Info("gap committed after poller.gap_wait, order kept", "outbox_id", id, "waited_ms", waited.Milliseconds())
		return
	}
	r.m.LateCommits.Inc()
	r.log.Warn("late commit", "aggregate_type", a.Type, "aggregate_id", a.ID, "outbox_id", id, "after_id", after,
		"waited_ms", waited.Milliseconds())
}
