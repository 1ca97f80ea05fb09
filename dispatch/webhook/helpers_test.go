package webhook_test

import (
	"time"

	"github.com/outboxd/outboxd/dispatch"
)

// batchOf is a batch of one event per aggregate named, ids from 1.
func batchOf(aggs ...string) dispatch.Batch {
	b := dispatch.Batch{Token: 7, Until: func() time.Time { return time.Now().Add(time.Hour) }}
	for i, a := range aggs {
		b.Events = append(b.Events, dispatch.Event{ID: int64(i + 1), AggregateType: "deal", AggregateID: a})
	}
	return b
}
