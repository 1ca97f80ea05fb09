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
// most pipelineDepth × batch_size rows are fetched and not yet written, and
// the sends in flight hold at most pipelineDepth × batch_max_bytes of loaded
// rows (plus one row: a fetch always returns its first).
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
//   - Results are written by one writer, one batch's settled aggregates at a
//     time (finish: owner-checked keys, then the fenced Postgres write): all
//     of a batch at once when its sends are over, and early an aggregate
//     that stopped (so it is not held behind the batch's slowest) or, after
//     Poller.earlyWrite, whatever has settled.
//   - Bounded: see pipelineDepth.
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
	written chan struct{} // closed when the writer has returned
	kick    chan struct{} // the writer: something may be writable
	wake    chan struct{} // the lead: room in the pipeline, or an error

	mu        sync.Mutex
	flights   []*flight // launch order, until every row is written
	busy      map[store.Aggregate]int
	unwritten map[int64]struct{} // rows fetched, results not yet written
	bytes     int64              // loaded bytes held by sends in flight
	full      bool               // the lead waits for room
	closing   bool               // no more flights: write all, then stop
	err       error              // write errors not yet reported
}

// flight is one batch in the pipeline.
type flight struct {
	claim   string    // its claim value: finish releases only these
	start   time.Time // its fetch
	bytes   int64
	sent    chan struct{} // closed when its sends are over
	left    int           // rows not yet written
	sending bool
	early   bool    // sending for longer than earlyWrite
	ready   []piece // settled aggregates, not yet written
}

// piece is one aggregate's rows of a flight, settled.
type piece struct {
	agg   store.Aggregate
	items []item // copies without payloads
	stops bool   // it stopped at a row not delivered: busy until written
}

func (p *Poller) newPipeline(work context.Context, fence store.Fence, trusted func() time.Time) *pipeline {
	ctx, cancel := context.WithCancel(work)
	pl := &pipeline{p: p, fence: fence, trusted: trusted, ctx: ctx, cancel: cancel,
		written: make(chan struct{}), kick: make(chan struct{}, 1), wake: make(chan struct{}, 1),
		busy: map[store.Aggregate]int{}, unwritten: map[int64]struct{}{}}
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
	rows := min(cfg.BatchSize, pipelineDepth*cfg.BatchSize-len(pl.unwritten))
	bytes := min(cfg.BatchMaxBytes, pipelineDepth*cfg.BatchMaxBytes-pl.bytes)
	if rows <= 0 || bytes <= 0 {
		pl.full = true
		return lim, false
	}
	return store.FetchLimits{Rows: rows, RowBytes: cfg.MaxPayloadBytes, Bytes: bytes,
		Skip: slices.Collect(maps.Keys(pl.unwritten)), Busy: slices.Collect(maps.Keys(pl.busy))}, true
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
func (pl *pipeline) launch(items []item, claim string, start time.Time) <-chan struct{} {
	f := &flight{claim: claim, start: start, sent: make(chan struct{}), left: len(items), sending: true}
	pl.mu.Lock()
	seen := map[store.Aggregate]bool{}
	for _, it := range items {
		pl.unwritten[it.row.ID] = struct{}{}
		if it.row.Size <= pl.p.cfg.MaxPayloadBytes { // loaded
			f.bytes += it.row.Size
		}
		if a := aggregateOf(it); !seen[a] {
			seen[a] = true
			pl.busy[a]++
		}
	}
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
		pl.p.deliver(pl.ctx, items, pl.fence.Token, pl.trusted, func(aggs [][]int) { pl.settle(f, items, aggs) })
		early.Stop()
		pl.mu.Lock()
		f.sending = false
		pl.bytes -= f.bytes
		if f.left == 0 { // every row written early
			pl.flights = slices.DeleteFunc(pl.flights, func(x *flight) bool { return x == f })
		}
		pl.freed()
		pl.mu.Unlock()
		close(f.sent)
		poke(pl.kick)
	})
	return f.sent
}

func aggregateOf(it item) store.Aggregate {
	return store.Aggregate{Type: it.row.AggregateType, ID: it.row.AggregateID}
}

// settle takes aggregates' rows (one slice per aggregate of a flight, each
// row with its final outcome) for writing. An aggregate that went through
// is free at once: its later rows may be fetched, its own stay skipped
// until written.
func (pl *pipeline) settle(f *flight, items []item, aggs [][]int) {
	pieces := make([]piece, len(aggs))
	for k, idx := range aggs {
		pc := piece{agg: aggregateOf(items[idx[0]]), items: make([]item, len(idx))}
		for j, i := range idx {
			pc.items[j] = items[i]
			pc.items[j].row.Payload, pc.items[j].row.Headers = nil, nil // the write needs none
			switch items[i].outcome {
			case pending, foreign, failed, refused:
				pc.stops = true
			}
		}
		pieces[k] = pc
	}
	pl.mu.Lock()
	f.ready = append(f.ready, pieces...)
	writable := f.early // else only a stop is written before the flight's sends are over
	for _, pc := range pieces {
		if !pc.stops {
			pl.release(pc.agg)
		}
		writable = writable || pc.stops
	}
	pl.mu.Unlock()
	if writable {
		poke(pl.kick)
	}
}

// release ends one flight's hold on a; pl.mu held.
func (pl *pipeline) release(a store.Aggregate) {
	if pl.busy[a]--; pl.busy[a] <= 0 {
		delete(pl.busy, a)
	}
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
		if len(f.ready) == 0 {
			continue
		}
		if !f.sending || f.early || pl.closing {
			pieces := f.ready
			f.ready = nil
			return f, pieces, false
		}
		var take, keep []piece
		for _, pc := range f.ready {
			if pc.stops {
				take = append(take, pc)
			} else {
				keep = append(keep, pc)
			}
		}
		if len(take) > 0 {
			f.ready = keep
			return f, take, false
		}
	}
	return nil, nil, pl.closing && len(pl.flights) == 0
}

// writePieces writes pieces of f, then lets their rows and stopped
// aggregates go, whether the write succeeded or not (a failed write leaves
// the rows due: the next fetch finds their keys, as after a crash).
func (pl *pipeline) writePieces(f *flight, pieces []piece) {
	var items []item
	for _, pc := range pieces {
		items = append(items, pc.items...)
	}
	fire(pl.p.hooks.afterSend)
	// Written even if the lease was lost meanwhile: the fence, not the
	// lease, decides whether they land, and landing them saves duplicates.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(pl.ctx), queryTimeout(pl.p.cfg))
	err := pl.p.finish(wctx, items, f.claim, pl.fence, f.start)
	cancel()

	pl.mu.Lock()
	defer pl.mu.Unlock()
	for _, it := range items {
		delete(pl.unwritten, it.row.ID)
	}
	for _, pc := range pieces {
		if pc.stops {
			pl.release(pc.agg)
		}
	}
	if f.left -= len(items); f.left == 0 && !f.sending {
		pl.flights = slices.DeleteFunc(pl.flights, func(x *flight) bool { return x == f })
	}
	if err != nil {
		pl.err = errors.Join(pl.err, fmt.Errorf("writing a batch's results: %w", err))
		if errors.Is(err, store.ErrStaleFence) {
			pl.cancel() // no holder any more: send nothing further
		}
		pl.full = true // the lead hears of it at once
	}
	pl.freed()
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
	return pl.takeErr()
}
