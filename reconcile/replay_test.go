package reconcile

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/keys"
	"github.com/outboxd/outboxd/store"
)

// An interrupted replay stops after the batch in flight, not after the
// shutdown timeout its term would grant: it reports what it requeued, the cause,
// and leaves the rest dead; the lock is released. The token it wrote under
// is lock:reconciliation's.
func TestReplayStopsWhenInterrupted(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ids := e.insertPending(5)
	e.exec(`UPDATE outbox SET dead_at = now() - (id || ' s')::interval, attempts = 9, last_error = 'boom'`)
	r := e.reconciler(Config{BatchSize: 1, ShutdownTimeout: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n, err := r.Replay(ctx, store.ReplayFilter{}, time.Second, func(done int64) {
		if done == 2 {
			cancel()
		}
	})
	if n != 2 || !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted replay: %d, %v; want 2, context.Canceled", n, err)
	}
	if dead := e.count(`SELECT count(*) FROM outbox WHERE dead_at IS NOT NULL`); dead != len(ids)-2 {
		t.Errorf("%d dead after the interrupted replay, want %d", dead, len(ids)-2)
	}
	if tok, _ := e.st.FenceToken(context.Background(), keys.ReconcileLock); tok < 1 {
		t.Errorf("fence of %s: %d, want the replay's token", keys.ReconcileLock, tok)
	}
	if r.HeldToken() != 0 {
		t.Errorf("the lock is still held (token %d)", r.HeldToken())
	}
}
