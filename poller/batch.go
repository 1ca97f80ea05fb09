package poller

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/store"
)

// outcome of one row in a batch.
type outcome uint8

const (
	pending   outcome = iota // claimed, not reached (aggregate stopped earlier): unclaim
	sent                     // delivered by us
	duplicate                // Redis holds this row's delivered mark: mark without sending
	foreign                  // a newer holder's claim: leave alone
	failed                   // send failed: unclaim, count the attempt
	refused                  // the idempotency key could not be claimed (wrong type, odd value): count the attempt
	poisoned                 // the row cannot be sent as it is (row.Poison): dead-letter, never claimed
)

type item struct {
	row     store.Row
	outcome outcome
	err     error
	fp      string // the row's fingerprint (keys.Fingerprint), set when claimed
}

// finishing is a batch whose results are being written (Redis keys, then
// the fenced Postgres write) while the next batch is fetched, claimed and
// sent: those writes are about a third of a batch's time, and the next
// batch does not need them, as long as it leaves this batch's rows alone
// (store.FetchLimits.Skip) and, if an aggregate stopped here at a row not
// delivered, waits for the write that makes that row back off (otherwise
// the aggregate's later rows would look due and overtake it).
// At most one batch is finishing at a time, so Postgres gets the results
// in batch order.
type finishing struct {
	ids   []int64 // the batch's rows
	stops bool    // an aggregate stopped at a row not delivered
	done  chan struct{}
	err   error
}

// wait returns the write's error once it is done; nil for a nil finishing.
func (f *finishing) wait() error {
	if f == nil {
		return nil
	}
	<-f.done
	return f.err
}

// skip is what the next fetch must leave out while f is being written.
func (f *finishing) skip() []int64 {
	if f == nil {
		return nil
	}
	return f.ids
}

// batchResult is what one batch tells the run loop.
type batchResult struct {
	fetched   int        // rows fetched
	more      bool       // a full batch: more are due at once
	held      bool       // rows were read but wait behind an earlier id: look again soon
	finishing *finishing // its results being written, or nil
}

// batch runs one fetch-claim-send cycle and starts writing its results,
// which go on beside the next batch (see finishing); prev is the previous
// batch's, or nil. trusted is the lease's local
// trust deadline: no send starts past it, and none outlives it; the fetch is
// bounded by it too.
func (p *Poller) batch(ctx context.Context, fence store.Fence, trusted func() time.Time, prev *finishing) (batchResult, error) {
	start := time.Now()
	if prev != nil && prev.stops {
		if err := p.waited(fence, prev); err != nil {
			return batchResult{}, err
		}
		prev = nil
	}
	qctx, cancel := context.WithDeadline(ctx, trusted())
	rows, held, err := p.fetch(qctx, fence, store.FetchLimits{
		Rows: p.cfg.BatchSize, RowBytes: p.cfg.MaxPayloadBytes, Bytes: p.cfg.BatchMaxBytes, Skip: prev.skip(),
	})
	cancel()
	if ctx.Err() == nil { // a lost lease or shutdown says nothing about Postgres
		p.health.note(err, time.Now())
	}
	if err != nil || len(rows) == 0 {
		return batchResult{held: held}, errors.Join(err, p.waited(fence, prev))
	}
	// A batch the byte budget cut is not "full": the next one follows after
	// the short busy pause, which is nothing beside sending 16 MiB.
	more := len(rows) >= p.cfg.BatchSize
	p.m.BatchSize.Observe(float64(len(rows)))
	items := make([]item, len(rows))
	for i, r := range rows {
		items[i].row = r
		if r.Poison != "" {
			items[i].outcome, items[i].err = poisoned, &dispatch.Error{Err: errors.New(r.Poison), Permanent: true}
		}
	}
	c := claimValue{token: fence.Token, owner: fence.Owner, batch: strconv.FormatInt(start.UnixNano(), 36)}
	if err := p.claimKeys(ctx, items, c); err != nil {
		p.unread(fence, rows)
		return batchResult{fetched: len(rows), more: more}, errors.Join(err, p.waited(fence, prev))
	}
	fire(p.hooks.afterClaim)
	p.deliver(ctx, items, fence.Token, trusted)
	fire(p.hooks.afterSend)
	p.readerFor(fence).sent(items)

	f := &finishing{ids: make([]int64, len(items)), done: make(chan struct{})}
	for i, it := range items {
		// The write needs no payloads: let them go before the next batch
		// loads its own, so at most one batch's bytes are held.
		items[i].row.Payload, items[i].row.Headers = nil, nil
		f.ids[i] = it.row.ID
		switch it.outcome {
		case pending, foreign, failed, refused:
			f.stops = true
		}
	}
	// Results are written even if the lease was lost meanwhile: the fence, not
	// the lease, decides whether they land, and landing them saves duplicates.
	// They go after the previous batch's, and that one's error (a stale
	// fence) is this batch's.
	perr := p.waited(fence, prev)
	go func() {
		defer close(f.done)
		wctx, cancelW := context.WithTimeout(context.WithoutCancel(ctx), queryTimeout(p.cfg))
		defer cancelW()
		if err := p.finish(wctx, items, c.String(), fence, start); err != nil {
			// Read by the next batch: say whose results these were.
			f.err = fmt.Errorf("writing an earlier batch's results: %w", err)
		}
	}()
	return batchResult{fetched: len(rows), more: more, finishing: f}, perr
}
