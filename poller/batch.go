package poller

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/store"
)

// batchResult is what one batch tells the run loop.
type batchResult struct {
	fetched int  // rows fetched
	more    bool // a full batch: more are due at once
	held    bool // rows were read but wait behind an earlier id: look again soon
	full    bool // the pipeline is full: nothing fetched, wait for room
}

// batch fetches and claims one batch and hands it to the pipeline, which
// sends it and writes its results beside the next batches (see pipeline).
// It returns when the batch's sends are over, when a per-event sink has a
// slot free (pipeline.awaitSlots), or after a poll interval of them,
// whichever comes first: a slow aggregate holds only its own rows, and a
// fast batch is not fetched behind (its aggregates would all look busy).
// The fetch is bounded by the lease's trust deadline; so is every send.
// Errors of earlier batches' result writes are returned here.
func (p *Poller) batch(ctx context.Context, pl *pipeline) (batchResult, error) {
	start := time.Now()
	qctx, cancel := context.WithDeadline(ctx, pl.trusted())
	defer cancel()
	// Before the room check: a pause takes effect (and is acknowledged)
	// while a full pipeline's sends are still under way.
	if err := p.paused.read(qctx, pl.fence); err != nil {
		return batchResult{}, errors.Join(err, pl.takeErr())
	}
	// What the writer settled since the last fetch, before the limits: a
	// row whose write ends after them is still in their Skip, and the
	// reader hears of it at the next fetch. Heard of after them, a failed
	// write's rows would be brought back above the cursor and then skipped
	// as in flight by this fetch, which moves the cursor past them unparked.
	pl.noteWritten(p.readerFor(pl.fence))
	lim, ok := pl.limits()
	if !ok {
		return batchResult{full: true}, pl.takeErr()
	}
	fire(p.hooks.afterLimits)
	if err := p.resumeRecovered(ctx, pl.fence); errors.Is(err, store.ErrStaleFence) {
		return batchResult{}, errors.Join(err, pl.takeErr())
	}
	fetchStart := time.Now()
	rows, held, err := p.fetch(qctx, pl.fence, lim)
	fetched := time.Now()
	if ctx.Err() == nil { // a lost lease or shutdown says nothing about Postgres
		p.health.note(err, fetched)
	}
	if err != nil || len(rows) == 0 {
		if err != nil && ctx.Err() == nil {
			p.startBatch(ctx, pl.fence, fetchStart, fetched, 0, err).end(nil)
		}
		return batchResult{held: held}, errors.Join(err, pl.takeErr())
	}
	tr := p.startBatch(ctx, pl.fence, fetchStart, fetched, len(rows), nil)
	// A batch the byte budget cut is not "full": the next one follows after
	// the short busy pause, which is nothing beside sending 16 MiB.
	more := len(rows) >= lim.Rows
	p.m.BatchSize.Observe(float64(len(rows)))
	items := make([]item, len(rows))
	for i, r := range rows {
		items[i].row = r
		if r.Poison != "" {
			items[i].outcome, items[i].err = poisoned, &dispatch.Error{Err: errors.New(r.Poison), Permanent: true}
		}
	}
	fence := pl.fence
	c := claimValue{token: fence.Token, owner: fence.Owner, batch: strconv.FormatInt(start.UnixNano(), 36)}
	_, claimSpan := tr.child(ctx, SpanClaim, len(items))
	err = p.claimKeys(ctx, items, c)
	if err != nil {
		fail(claimSpan, err)
		claimSpan.End()
		tr.end(err)
		p.readerFor(fence).unread(rows)
		return batchResult{fetched: len(rows), more: more}, errors.Join(err, pl.takeErr())
	}
	claimSpan.End()
	if err := p.rescuedLate(ctx, pl, p.readerFor(fence), items); err != nil {
		// The rows are delivered all the same; only a WARN may be missing.
		p.log.Warn("late commit check failed", "error", err)
	}
	fire(p.hooks.afterClaim)
	idle := p.held(rows) // sent all the same: answered NotAttempted, parked
	sent := pl.launch(items, c.String(), start, tr)
	pl.awaitSlots(ctx, sent, p.cfg.PollInterval)
	if idle {
		return batchResult{}, pl.takeErr()
	}
	return batchResult{fetched: len(rows), more: more}, pl.takeErr()
}

// readerFor returns the term's reader, a new one when the term changed.
func (p *Poller) readerFor(f store.Fence) *reader {
	if p.rd == nil || p.rd.fence != f {
		p.rd = newReader(f, p.readDeps(), false)
	}
	return p.rd
}

// readDeps are what the term's reader acts on.
func (p *Poller) readDeps() readDeps {
	return readDeps{store: p.store, log: p.log, m: p.m, gapWait: p.cfg.GapWait, rescanEvery: p.rescanEvery,
		maxInherit: p.maxInherit, maxLastSent: p.maxLastSent, stats: &p.readStats}
}

// fetch reads the next batch's rows through the term's reader (reader.fetch).
// A read that reused ids at or below the cursor starts the term's read state
// again (rewind.go).
func (p *Poller) fetch(ctx context.Context, f store.Fence, lim store.FetchLimits) (rows []store.Row, held bool, err error) {
	rows, held, again, err := p.readerFor(f).fetch(ctx, lim)
	if again != readOn {
		p.rd = newReader(f, p.readDeps(), again == readCold)
	}
	return rows, held, err
}

// rescuedLate starts the check of a claimed batch's rows found below the
// cursor (foundCheck) off the lead goroutine (pipeline.walkLate). An error
// names the rows left unchecked; they are delivered all the same.
func (p *Poller) rescuedLate(ctx context.Context, pl *pipeline, r *reader, items []item) error {
	check := r.late.claimed(items)
	if len(check) == 0 {
		return nil
	}
	return pl.walkLate(ctx, check, r.late.mark())
}
