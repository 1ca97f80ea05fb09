package app

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/outboxd/outboxd/internal/keys"
)

// pauseAckPoll is how often AwaitPause looks at the acknowledgement.
const pauseAckPoll = 50 * time.Millisecond

// ErrPauseNotApplied: the leader did not acknowledge a pause generation in
// time (AwaitPause).
var ErrPauseNotApplied = errors.New("not yet acknowledged by the leader")

// PauseEffect is how a pause or resume took effect: Leader, the instance_id
// of the leader that acknowledged it, or NoLeader, when no replica held
// lock:outbox:poller (the next leader reads the paused destinations before
// its first send).
type PauseEffect struct {
	Leader   string
	NoLeader bool
}

// AwaitPause waits up to wait until a leader has acknowledged pause
// generation gen (store.AckPause: it holds back the sends of what was
// paused by then) or no replica holds lock:outbox:poller. Past wait, the
// error wraps ErrPauseNotApplied and names the holder.
func (a *App) AwaitPause(ctx context.Context, gen int64, wait time.Duration) (PauseEffect, error) {
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	tick := time.NewTicker(pauseAckPoll)
	defer tick.Stop()
	var holder string
	var last error
	for {
		applied, err := a.Store.Ops().PauseApplied(wctx)
		h, herr := a.Locks.Holder(wctx, keys.PollerLock)
		switch {
		case err == nil && applied >= gen:
			return PauseEffect{Leader: h.Instance}, nil
		case herr == nil && h.Owner == "":
			return PauseEffect{NoLeader: true}, nil
		}
		if herr == nil {
			holder = h.Instance
		}
		if e := errors.Join(err, herr); e != nil && wctx.Err() == nil {
			last = e
		}
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return PauseEffect{}, ctx.Err()
			}
			err := fmt.Errorf("%w %s within %s (generation %d)", ErrPauseNotApplied, holderName(holder), wait, gen)
			if last != nil {
				err = fmt.Errorf("%w: %w", err, last)
			}
			return PauseEffect{}, err
		case <-tick.C:
		}
	}
}

// holderName names a holder for a message.
func holderName(instance string) string {
	if instance == "" {
		return "(instance unknown)"
	}
	return instance
}
