package poller

import (
	"context"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/store"
)

// resumeRecovered makes due at once the rows charged a failure by a
// destination whose circuit has closed since (dispatch.Recovered): they
// failed for the destination's outage, not their own, and their aggregates
// resume with the others. A failed write leaves them to their backoff.
func (p *Poller) resumeRecovered(ctx context.Context, f store.Fence) error {
	ids := dispatch.Recovered(p.sink)
	if len(ids) == 0 {
		return nil
	}
	n, err := p.store.DueNow(ctx, f, ids)
	if err != nil {
		p.log.Warn("rows failed in an outage not resumed", "error", err, "batch_size", len(ids))
		return err
	}
	p.log.Info("rows failed in an outage resumed", "batch_size", len(ids), "resumed", n)
	return nil
}

// held is whether every row waits on an open circuit (dispatch.Holds): the
// lead then polls at poll_interval rather than at once.
func (p *Poller) held(rows []store.Row) bool {
	for _, r := range rows {
		if !dispatch.Holds(p.sink, dispatch.Event{ID: r.ID, AggregateType: r.AggregateType, AggregateID: r.AggregateID, EventType: r.EventType}) {
			return false
		}
	}
	return len(rows) > 0
}
