package poller

import (
	"cmp"
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/outboxd/outboxd/internal/term"
	"github.com/outboxd/outboxd/lock"
	"github.com/outboxd/outboxd/store"
)

// Run competes for the lock and, while it holds it, relays events. It
// returns nil when ctx is cancelled, after in-flight work has finished (or
// ShutdownTimeout passed) and the lock has been released. Losing the lock or
// an outage of Redis or Postgres never ends Run: it waits and tries again.
func (p *Poller) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	if p.cfg.Notify {
		lctx, cancel := context.WithCancel(ctx)
		defer cancel()
		wg.Go(func() { p.listen(lctx) })
	}
	retry := newBackoff(100*time.Millisecond, 5*time.Second)
	for ctx.Err() == nil {
		err := p.seat.Run(ctx, 0, func(work context.Context, t *term.Term) error { return p.lead(ctx, work, t) })
		switch {
		case ctx.Err() != nil:
		case !errors.Is(err, term.ErrNotAcquired):
			retry.reset()
			if err != nil && !errors.Is(err, store.ErrStaleFence) {
				p.log.Error("stepping down", "error", err)
			}
		case errors.Is(err, lock.ErrCorrupt): // before HeldElsewhere: in Redlock mode both can hold
			// Nothing delivers until an operator repairs Redis: say so loudly,
			// and keep checking, so the relay resumes once the key is fixed.
			p.log.Error("lock state corrupted", "error", err)
			sleep(ctx, retry.next())
		case lock.HeldElsewhere(err):
		default:
			// Redis or Postgres unreachable: say so, and back off.
			p.log.Warn("lock attempt failed", "error", err)
			sleep(ctx, retry.next())
		}
	}
	return nil
}

// lead runs batches while the term holds and ctx is live. Shutdown order:
// stop fetching (ctx) → finish the sends in flight (work, cancelled by the
// term ShutdownTimeout later) and write their results → release (the term,
// when lead returns).
func (p *Poller) lead(ctx, work context.Context, t *term.Term) (err error) {
	var quiet quietWait
	pl := p.newPipeline(work, t.Fence(), t.TrustedUntil)
	defer func() {
		// Every result is written (or has failed) before the term ends.
		switch ferr := pl.close(); {
		case ferr == nil:
		case errors.Is(ferr, store.ErrStaleFence):
			err = cmp.Or(err, ferr)
		default:
			t.Log().Error("batch failed", "error", ferr)
		}
	}()
	for {
		if ctx.Err() != nil || work.Err() != nil {
			return nil // "lock lost" is logged on release
		}
		res, err := p.batch(work, pl)
		switch {
		case errors.Is(err, store.ErrStaleFence):
			return err
		case work.Err() != nil:
			return nil
		case err != nil:
			t.Log().Error("batch failed", "error", err)
		}
		if d := p.pause(res, err, &quiet); d > 0 && p.wait(ctx, work, pl, d) {
			quiet.rows() // woken: rows, room or an error; look at once, then as after rows
		}
	}
}

// pause is how long the lead waits before the next batch, after one that
// returned res and err; quiet counts the empty fetches since the last rows.
func (p *Poller) pause(res batchResult, err error, quiet *quietWait) time.Duration {
	switch {
	case err != nil, res.full:
		return p.cfg.PollInterval // or until the pipeline has room (pl.wake)
	case res.more:
		quiet.rows()
		return 0 // more waiting: go again at once
	case res.fetched > 0 || res.held:
		// A stream, or rows waiting for an earlier id to commit: the next
		// rows are due within about a poll.
		quiet.rows()
		return time.Millisecond
	}
	// Quiet: a millisecond for a few empty fetches, then 2, 4 ... ms up to
	// poll_interval (quietWait), so a gap in a stream costs a millisecond,
	// not a poll interval.
	return quiet.next(p.cfg.PollInterval)
}

// wait waits d, or until ctx or work ends; it returns true when woken
// early by a NOTIFY or by the pipeline (room, an error, rows written).
func (p *Poller) wait(ctx, work context.Context, pl *pipeline, d time.Duration) (woken bool) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
	case <-work.Done():
	case <-p.wake:
		return true
	case <-pl.wake:
		return true
	case <-timer.C:
	}
	return false
}

// listen wakes the leader on NOTIFY outbox_events. Polling continues either
// way; this only shortens the wait.
func (p *Poller) listen(ctx context.Context) {
	retry := newBackoff(100*time.Millisecond, 5*time.Second)
	for ctx.Err() == nil {
		err := p.store.Listen(ctx, "outbox_events", func() {
			retry.reset()
			select {
			case p.wake <- struct{}{}:
			default:
			}
		})
		if ctx.Err() == nil {
			p.log.Warn("listen failed", "error", err)
			sleep(ctx, retry.next())
		}
	}
}

type backoff struct{ base, cap, cur time.Duration }

func newBackoff(base, cap time.Duration) *backoff { return &backoff{base: base, cap: cap} }
func (b *backoff) reset()                         { b.cur = 0 }
func (b *backoff) next() time.Duration {
	b.cur = min(max(2*b.cur, b.base), b.cap)
	return b.cur/2 + time.Duration(rand.Int64N(int64(b.cur/2)+1))
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
