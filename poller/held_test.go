package poller

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/internal/metrics"
	"github.com/outboxd/outboxd/internal/term"
	"github.com/outboxd/outboxd/internal/testkit"
	"github.com/outboxd/outboxd/lock"
)

// A destination that holds the send without a final answer until the lease
// cuts it (Result.Unanswered) costs an attempt every time, the first
// included: with max_attempts 2 the row is dead after 2 sends, not 4. A
// send cut because the lease itself was lost counts no attempt (cutShort:
// the cut is ours): under load a 1 s lease was lost once and the row took
// 3 sends, so each such send, logged "send abandoned", is counted apart.
func TestHeldSendsCountFromTheFirstCut(t *testing.T) {
	e := newEnv(t)
	e.insert(1, 1)
	var sends atomic.Int32
	held := dispatch.PerEvent(func(ctx context.Context, _ dispatch.Event, _ int64) error {
		sends.Add(1)
		<-ctx.Done() // written, and never answered
		return &dispatch.Error{Err: ctx.Err(), Unanswered: true}
	}, 1, dispatch.Capabilities{})
	cfg := testConfig()
	cfg.LockTTL, cfg.MaxAttempts, cfg.KeyPrefix = time.Second, 2, e.prefix
	var logs testkit.Logs
	m := metrics.New()
	locks := lock.New([]redis.UniversalClient{e.rdb}, lock.WithKeyPrefix(e.prefix), lock.WithHooks(term.Hooks(m)))
	p := New(cfg.Config, Deps{Store: e.st, Locks: locks, Redis: e.rdb, Sink: held, Log: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})), Metrics: m})
	e.run(&runner{p, m})
	e.waitFor("the row dead-lettered", time.Minute, func() bool { return e.count("dead_at IS NOT NULL") == 1 })
	if n := e.count("attempts = 2 AND last_error LIKE '%held it without a final answer%'"); n != 1 {
		t.Fatal("the dead row does not say the destination held its sends")
	}
	abandoned := logs.Count(`"msg":"send abandoned"`)
	if n := sends.Load(); int(n) != 2+abandoned {
		t.Fatalf("%d sends before the row was dead, want 2 (one per attempt) + %d abandoned with a lost lease", n, abandoned)
	}
}
