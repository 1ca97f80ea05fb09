package poller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/outboxd/outboxd/store"
)

// pipelineDepth bounds the work in flight, so no slow aggregate needs a
// batch-wide barrier and memory still does not grow with the backlog: at
// most pipelineDepth × batch_size rows (or 2 × the sink's Parallel, when
// that is more: a per-event sink sending more aggregates at once than a
// batch holds) are fetched and not yet written, and the sends in flight
// hold at most pipelineDepth × batch_max_bytes of loaded rows (plus one
// row: a fetch always returns its first).
const pipelineDepth = 4

// earlyWrite is how long a batch's settled aggregates wait for its slowest
// one before their results are written without it (Poller.earlyWrite; tests
// change it). Until then a batch's results go in one write, as when nothing
// is slow.
const earlyWrite = time.Second

// pipeline runs the batches of one term. Each batch is sent in its own
// goroutine (a flight), so the next batch starts while an earlier one's
// slow aggregates are still being sent. Guarantees, kept here:
//   - Per-aggregate order: an aggregate is busy from the fetch that took its
//     rows until its last row in that batch has a final result (the sink's
//     Batch.Done, or Send's return), and, if it stopped at a row not
//     delivered, until that row's result is written (its backoff in place,
//     or its claim released): no fetch returns any of its rows meanwhile
//     (store.FetchLimits.Busy). A fetch also leaves out every row fetched
//     and not yet written (store.FetchLimits.Skip).
//   - Results are written by one writer, in turn (finish: owner-checked
//     keys, then the fenced Postgres write): all of a batch at once when its
//     sends are over; early, an aggregate that stopped (so it is not held
//     behind the batch's slowest) or, after Poller.earlyWrite, whatever of
//     the batch has settled.
//   - Bounded: see pipelineDepth. And no fetch runs ahead of the writer by
//     more than a batch: while more than batch_size rows wait to be
//     written, the next fetch waits.
//   - The sink kept busy: a per-event sink (Capabilities.Parallel) sends
//     aggregates of several batches at once; the lead fetches the next
//     batch as soon as fewer aggregates than that are sending (slots), not
//     when the last batch's sends are over, so a receiver's latency is not
//     paid once per batch.
//   - Shutdown: close waits for the sends (bounded by the term's work
//     context and the trust deadline), then for every result to be written.
//
// A stale fence stops every send in flight; the error reaches the lead
// through the next batch.
type pipeline struct {
	p       *Poller
	fence   store.Fence
	trusted func() time.Time
	ctx     context.Context // the sends'; cancelled on a stale fence and at close
	cancel  context.CancelFunc
	sends   sync.WaitGroup
	// lateWalks is the late-commit walk running (walkLate), at most one:
	// lateWalk holds its place.
	lateWalks sync.WaitGroup
	lateWalk  chan struct{}
	written   chan struct{} // closed when the writer has returned
	kick      chan struct{} // the writer: something may be writable
	wake      chan struct{} // the lead: room in the pipeline, an error, or rows written
	slots     chan struct{} // the lead: fewer aggregates sending than parallel
	// parallel is how many aggregates the sink sends at once
	// (Capabilities.Parallel); 0: it takes a batch as a whole.
	parallel int
	maxRows  int // rows fetched and not yet written, at most

	mu        sync.Mutex
	flights   []*flight // launch order, until every row is written
	busy      map[store.Aggregate]struct{}
	unwritten int           // rows fetched, results not yet written
	sending   int           // aggregates launched and not yet settled
	writing   int           // rows being written
	bytes     int64         // loaded bytes held by sends in flight
	full      bool          // the lead waits for room
	closing   bool          // no more flights: write all, then stop
	err       error         // write errors not yet reported
	notes     []writtenNote // writes the reader has not heard of (noteWritten)
}

// flight is one batch in the pipeline.
type flight struct {
	claim   string    // its claim value: finish releases only these
	start   time.Time // its fetch
	bytes   int64
	sent    chan struct{} // closed when its sends are over
	ids     []int64       // its rows
	written []bool        // by row: its result is written
	left    int           // rows not yet written
	sending bool
	early   bool    // sending for longer than earlyWrite
	ready   []piece // settled rows, not yet written

	trace batchTrace // its span, ended when it is dropped (trace.go)
}

// piece is settled rows of a flight: one or more aggregates'.
type piece struct {
	idx     []int             // the rows, indexes in the flight
	items   []item            // their copies, without payloads
	stopped []store.Aggregate // aggregates that stopped at a row not delivered: busy until written
}

// writable is whether the writer may take pieces of f now (all of them, or
// only stops); pl.mu held.
func (pl *pipeline) writable(f *flight) bool { return !f.sending || f.early || pl.closing }

func (p *Poller) newPipeline(work context.Context, fence store.Fence, trusted func() time.Time) *pipeline {
	ctx, cancel := context.WithCancel(work)
	parallel := max(p.sink.Capabilities().Parallel, 0)
	pl := &pipeline{p: p, fence: fence, trusted: trusted, ctx: ctx, cancel: cancel,
		written: make(chan struct{}), kick: make(chan struct{}, 1), wake: make(chan struct{}, 1),
		slots: make(chan struct{}, 1), lateWalk: make(chan struct{}, 1), parallel: parallel, maxRows: max(pipelineDepth*p.cfg.BatchSize, 2*parallel),
		busy: map[store.Aggregate]struct{}{}}
	go pl.write()
	return pl
}

func poke(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// limits are the next fetch's, or ok false when the pipeline is full (wait
// on wake).
func (pl *pipeline) limits() (lim store.FetchLimits, ok bool) {
	cfg := pl.p.cfg
	pl.mu.Lock()
	defer pl.mu.Unlock()
	queued := pl.writing // rows the writer has or could take now
	for _, f := range pl.flights {
		all := pl.writable(f)
		for _, pc := range f.ready {
			if all || len(pc.stopped) > 0 {
				queued += len(pc.idx)
			}
		}
	}
	// A whole batch or none: the read scans as many rows above its cursor
	// as it is asked for, and a read asking for fewer than the last could
	// move the cursor past rows it never looked at (up to the ids an earlier
	// read classified).
	rows := cfg.BatchSize
	bytes := min(cfg.BatchMaxBytes, pipelineDepth*cfg.BatchMaxBytes-pl.bytes)
	if pl.unwritten+rows > pl.maxRows || bytes <= 0 || queued > cfg.BatchSize {
		pl.full = true
		return lim, false
	}
	skip := make([]int64, 0, pl.unwritten)
	for _, f := range pl.flights {
		for i, id := range f.ids {
			if !f.written[i] {
				skip = append(skip, id)
			}
		}
	}
	return store.FetchLimits{Rows: rows, RowBytes: cfg.MaxPayloadBytes, Bytes: bytes,
		Skip: skip, Busy: slices.Collect(maps.Keys(pl.busy))}, true
}

// takeErr returns the write errors since the last call.
func (pl *pipeline) takeErr() error {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	err := pl.err
	pl.err = nil
	return err
}

// launch sends a claimed batch in its own goroutine; the returned channel
// closes when its sends are over.
func (pl *pipeline) launch(items []item, claim string, start time.Time, tr batchTrace) <-chan struct{} {
	f := &flight{claim: claim, start: start, trace: tr, sent: make(chan struct{}), ids: make([]int64, len(items)),
		written: make([]bool, len(items)), left: len(items), sending: true}
	for i, it := range items {
		f.ids[i] = it.row.ID
		if it.row.Size <= pl.p.cfg.MaxPayloadBytes { // loaded
			f.bytes += it.row.Size
		}
	}
	pl.mu.Lock()
	// No other flight holds these aggregates (the fetch left busy ones
	// out), so those added here are the batch's, each counted once: settle
	// counts each off once. Collected first into a set of their own, they
	// cost a map per batch (160 bytes a row).
	before := len(pl.busy)
	for _, it := range items {
		pl.busy[aggregateOf(it)] = struct{}{}
	}
	pl.sending += len(pl.busy) - before
	pl.unwritten += len(items)
	pl.bytes += f.bytes
	pl.flights = append(pl.flights, f)
	pl.mu.Unlock()

	pl.sends.Go(func() {
		early := time.AfterFunc(pl.p.earlyWrite, func() {
			pl.mu.Lock()
			f.early = true
			pl.mu.Unlock()
			poke(pl.kick)
		})
		sctx, span := tr.child(pl.ctx, SpanSend, len(items))
		pl.p.deliver(sctx, items, pl.fence.Token, pl.trusted, func(aggs [][]int) { pl.settle(f, items, aggs) })
		span.End()
		early.Stop()
		pl.mu.Lock()
		f.sending = false
		pl.bytes -= f.bytes
		if f.left == 0 { // every row written early
			pl.drop(f)
		}
		pl.freed()
		pl.mu.Unlock()
		close(f.sent)
		poke(pl.kick)
	})
	return f.sent
}

// awaitSlots returns once the lead may fetch the next batch: when sent
// closes (the last batch's sends are over), when the sink sends fewer
// aggregates than it can (Capabilities.Parallel), when d has passed, or
// when ctx ends.
func (pl *pipeline) awaitSlots(ctx context.Context, sent <-chan struct{}, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	for !pl.slotFree() {
		select {
		case <-sent:
			return
		case <-t.C:
			return
		case <-ctx.Done():
			return
		case <-pl.slots:
		}
	}
}

// slotFree is whether a per-event sink has a slot for another aggregate.
func (pl *pipeline) slotFree() bool {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return pl.sending < pl.parallel
}

// settle takes aggregates' rows (one slice per aggregate of flight f, each
// row with its final outcome) for writing. An aggregate that went through
// is free at once: its later rows may be fetched, its own stay skipped
// until written.
func (pl *pipeline) settle(f *flight, items []item, aggs [][]int) {
	n := 0
	for _, idx := range aggs {
		n += len(idx)
	}
	// Sized once: grown by append, a batch's rows would be copied again at
	// every doubling, on every batch of a drain.
	pc := piece{idx: make([]int, 0, n), items: make([]item, 0, n)}
	free := make([]store.Aggregate, 0, len(aggs))
	for _, idx := range aggs {
		stops := false
		for _, i := range idx {
			it := items[i]
			it.row.Payload, it.row.Headers = nil, nil // the write needs none
			pc.idx, pc.items = append(pc.idx, i), append(pc.items, it)
			switch it.outcome {
			case pending, foreign, failed, refused:
				stops = true
			}
		}
		if a := aggregateOf(items[idx[0]]); stops {
			pc.stopped = append(pc.stopped, a)
		} else {
			free = append(free, a)
		}
	}
	pl.mu.Lock()
	f.ready = append(f.ready, pc)
	for _, a := range free {
		delete(pl.busy, a)
	}
	pl.sending -= len(aggs)
	slot := pl.sending < pl.parallel
	writable := len(pc.stopped) > 0 || pl.writable(f)
	pl.mu.Unlock()
	if writable {
		poke(pl.kick)
	}
	if slot {
		poke(pl.slots)
	}
}

// drop forgets f, done: sent and written; pl.mu held.
func (pl *pipeline) drop(f *flight) {
	pl.flights = slices.DeleteFunc(pl.flights, func(x *flight) bool { return x == f })
	f.trace.end(nil)
}

// freed tells a lead waiting for room; pl.mu held.
func (pl *pipeline) freed() {
	if pl.full {
		pl.full = false
		poke(pl.wake)
	}
}

// write is the writer: it writes what is writable until close.
func (pl *pipeline) write() {
	defer close(pl.written)
	for {
		f, pieces, done := pl.take()
		if done {
			return
		}
		if f == nil {
			<-pl.kick
			continue
		}
		pl.writePieces(f, pieces)
	}
}

// take picks the next write: a flight's writable pieces (see pipeline).
func (pl *pipeline) take() (*flight, []piece, bool) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	for _, f := range pl.flights {
		var take, keep []piece
		for _, pc := range f.ready {
			if pl.writable(f) || len(pc.stopped) > 0 {
				take = append(take, pc)
			} else {
				keep = append(keep, pc)
			}
		}
		if len(take) > 0 {
			f.ready = keep
			for _, pc := range take {
				pl.writing += len(pc.idx)
			}
			return f, take, false
		}
	}
	return nil, nil, pl.closing && len(pl.flights) == 0
}

// writePieces writes pieces of f, then lets their rows and stopped
// aggregates go, whether the write succeeded or not (a failed write leaves
// the rows due: the next fetch finds their keys, as after a crash).
func (pl *pipeline) writePieces(f *flight, pieces []piece) {
	// settle's copies: without payloads, never changed again. A batch whose
	// aggregates all settled at once is one piece, written as it is: joined
	// into a new slice, it would be copied a second time.
	items := pieces[0].items
	if len(pieces) > 1 {
		n := 0
		for _, pc := range pieces {
			n += len(pc.items)
		}
		items = make([]item, 0, n)
		for _, pc := range pieces {
			items = append(items, pc.items...)
		}
	}
	fire(pl.p.hooks.afterSend)
	// Written even if the lease was lost meanwhile: the fence, not the
	// lease, decides whether they land, and landing them saves duplicates.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(pl.ctx), queryTimeout(pl.p.cfg))
	unmarked, err := pl.p.finish(f.trace.in(wctx), items, f.claim, pl.fence, f.start)
	cancel()
	defer fire(pl.p.hooks.afterWrite) // after the unlock below

	pl.mu.Lock()
	defer pl.mu.Unlock()
	for _, pc := range pieces {
		for _, i := range pc.idx {
			f.written[i] = true
		}
		for _, a := range pc.stopped {
			delete(pl.busy, a)
		}
	}
	pl.writing -= len(items)
	pl.unwritten -= len(items)
	pl.notes = append(pl.notes, writtenNote{items: items, failed: err != nil || unmarked})
	if f.left -= len(items); f.left == 0 && !f.sending {
		pl.drop(f)
	}
	if err != nil {
		pl.err = errors.Join(pl.err, fmt.Errorf("writing a batch's results: %w", err))
		if errors.Is(err, store.ErrStaleFence) {
			pl.cancel() // no holder any more: send nothing further
		}
		pl.full = true // the lead hears of it at once
	}
	pl.freed()
	// Rows written: a lead that found every aggregate busy looks again, and
	// its reader hears of these first (noteWritten).
	poke(pl.wake)
}

// close waits for every send, then for every result to be written, and
// returns the write errors not yet reported.
func (pl *pipeline) close() error {
	pl.sends.Wait()
	pl.mu.Lock()
	pl.closing = true
	pl.mu.Unlock()
	poke(pl.kick)
	<-pl.written
	pl.cancel()
	pl.lateWalks.Wait()
	return pl.takeErr()
}

// writtenNote is a write the reader has not heard of yet (noteWritten).
type writtenNote struct {
	items  []item // without payloads
	failed bool   // the write failed, or left rows unwritten: read them again
}

// noteWritten tells the term's reader, on the lead goroutine (the reader's
// only user), what the writer has written since the last call: delivered
// rows for its late-commit memory, rows left pending below the cursor to
// park, and the rows of a failed write to read again (reader.written).
func (pl *pipeline) noteWritten(r *reader) {
	pl.mu.Lock()
	notes := pl.notes
	pl.notes = nil
	pl.mu.Unlock()
	for _, n := range notes {
		r.written(n.items, n.failed)
	}
}

// walkLate starts the late-commit walk of rescuedLate's rows on a view
// taken now, owned by the pipeline. close waits for it, and cancels it once
// every result is written: a walk cut short says so. Only the view is taken
// on the caller's goroutine, within the lease's trust deadline.
func (pl *pipeline) walkLate(ctx context.Context, check []store.Row, sent int64) error {
	ids := make([]int64, len(check))
	for i, row := range check {
		ids[i] = row.ID
	}
	select {
	case pl.lateWalk <- struct{}{}:
	default:
		return fmt.Errorf("late commit check of outbox ids %v skipped: the check of earlier rows is still running", ids)
	}
	vctx, cancel := context.WithDeadline(ctx, pl.trusted())
	view, err := pl.p.store.View(vctx)
	cancel()
	if err != nil {
		<-pl.lateWalk
		return fmt.Errorf("late commit check of outbox ids %v: %w", ids, err)
	}
	report := lateReport{log: pl.p.log, m: pl.p.m}
	pl.lateWalks.Go(func() {
		defer func() {
			view.Close()
			<-pl.lateWalk
			fire(pl.p.hooks.lateWalked)
		}()
		fire(pl.p.hooks.lateWalk)
		later, err := view.LaterSent(pl.ctx, check, sent)
		if err != nil {
			pl.p.log.Warn("late commit check failed", "error", fmt.Errorf("outbox ids %v: %w", ids, err))
			return
		}
		for _, row := range check {
			if after, ok := later[row.ID]; ok {
				report.late(lateRow{row: row, after: after})
			}
		}
	})
	return nil
}
