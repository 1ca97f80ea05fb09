package term_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/outboxd/outboxd/internal/metrics"
	"github.com/outboxd/outboxd/internal/term"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/internal/testkit"
	"github.com/outboxd/outboxd/lock"
	"github.com/outboxd/outboxd/lock/redislease"
	"github.com/outboxd/outboxd/store"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const name = "lock:test"

// testBundle is what every test starts with: its own database, Redis key
// prefix, metrics and log lines.
type testBundle struct {
	st     *store.Store
	rdb    *redis.Client
	prefix string
	m      *metrics.Metrics
	logs   *testkit.Logs
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	st, _ := testenv.Store(t)
	rdb, prefix := testenv.Redis(t)
	return &testBundle{st: st, rdb: rdb, prefix: prefix, m: metrics.New(), logs: &testkit.Logs{}}
}

func (b *testBundle) seat(o term.Options) *term.Seat {
	locks := redislease.New([]redis.UniversalClient{b.rdb}, redislease.WithKeyPrefix(b.prefix), redislease.WithHooks(term.Hooks(b.m)))
	return term.New(name, o, term.Deps{Locks: locks, Store: b.st, Log: slog.New(slog.NewJSONHandler(b.logs, nil)), Metrics: b.m})
}

// The fence is raised to the term's token before the work starts, the token
// is published while held, and the lock is released (logged) afterwards.
func TestRunRaisesTheFenceFirstAndReleasesAfter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := b.seat(term.Options{TTL: 5 * time.Second, Wait: time.Second})
	ctx := context.Background()
	err := s.Run(ctx, 0, func(ctx context.Context, tm *term.Term) error {
		if got, _ := b.st.FenceToken(ctx, name); got != tm.Token() {
			t.Errorf("fence %d when the work started, want the term's token %d", got, tm.Token())
		}
		if s.Token() != tm.Token() {
			t.Errorf("published token %d, want %d", s.Token(), tm.Token())
		}
		if !time.Now().Before(tm.TrustedUntil()) {
			t.Error("trust deadline already passed")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if s.Token() != 0 {
		t.Fatalf("token %d published after the term", s.Token())
	}
	if n := b.rdb.Exists(ctx, b.prefix+name).Val(); n != 0 {
		t.Fatal("lock key left after the term")
	}
	for _, msg := range []string{`"msg":"lock acquired"`, `"msg":"lock released"`} {
		if !strings.Contains(b.logs.String(), msg) {
			t.Fatalf("no %s line:\n%s", msg, b.logs.String())
		}
	}
}

// A superseded term is counted and logged once, as "fence rejected".
func TestStaleFenceIsCountedAndLogged(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := b.seat(term.Options{TTL: 5 * time.Second, Wait: time.Second})
	err := s.Run(context.Background(), 0, func(ctx context.Context, tm *term.Term) error {
		newer := store.Fence{Lock: name, Token: tm.Token() + 10, Owner: "newer"}
		if err := b.st.ClaimFence(ctx, newer); err != nil {
			return err
		}
		return b.st.ClaimFence(ctx, tm.Fence())
	})
	if !errors.Is(err, store.ErrStaleFence) {
		t.Fatalf("Run returned %v, want ErrStaleFence", err)
	}
	if n := testutil.ToFloat64(b.m.FenceRejections.WithLabelValues(name)); n != 1 {
		t.Fatalf("fence rejections %v, want 1", n)
	}
	if c := strings.Count(b.logs.String(), `"msg":"fence rejected"`); c != 1 {
		t.Fatalf("%d fence rejected lines, want 1", c)
	}
}

// Every end of a held term is logged once: "lock released" when the key
// was still ours, "lock lost" otherwise, however the term ended (a write
// refused by the fence, the key gone at release, the lease lost while
// working), and each lost term is counted once in
// outboxd_lock_losses_total.
func TestEveryEndOfATermIsReleasedOrLost(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	for _, tc := range []struct {
		name string
		ttl  time.Duration
		work func(b *testBundle) func(context.Context, *term.Term) error
		want string // "lock released" or "lock lost"
	}{
		{"work done", 5 * time.Second, func(*testBundle) func(context.Context, *term.Term) error {
			return func(context.Context, *term.Term) error { return nil }
		}, "lock released"},
		{"work failed, key still ours", 5 * time.Second, func(*testBundle) func(context.Context, *term.Term) error {
			return func(context.Context, *term.Term) error { return boom }
		}, "lock released"},
		{"fence rejected", 5 * time.Second, func(b *testBundle) func(context.Context, *term.Term) error {
			return func(ctx context.Context, tm *term.Term) error {
				if err := b.st.ClaimFence(ctx, store.Fence{Lock: name, Token: tm.Token() + 10, Owner: "newer"}); err != nil {
					return err
				}
				return b.st.ClaimFence(ctx, tm.Fence())
			}
		}, "lock lost"},
		{"key evicted before the renewal noticed", 5 * time.Second, func(b *testBundle) func(context.Context, *term.Term) error {
			return func(ctx context.Context, _ *term.Term) error { return b.rdb.Del(ctx, b.prefix+name).Err() }
		}, "lock lost"},
		{"key evicted, the renewal noticed", time.Second, func(b *testBundle) func(context.Context, *term.Term) error {
			return func(ctx context.Context, _ *term.Term) error {
				if err := b.rdb.Del(ctx, b.prefix+name).Err(); err != nil {
					return err
				}
				<-ctx.Done() // the lease lost: the lock reports it itself
				return nil
			}
		}, "lock lost"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			s := b.seat(term.Options{TTL: tc.ttl, Wait: time.Second})
			_ = s.Run(context.Background(), 0, tc.work(b))
			logs := b.logs.String()
			released, lost := strings.Count(logs, `"msg":"lock released"`), strings.Count(logs, `"msg":"lock lost"`)
			losses := testutil.ToFloat64(b.m.LockLosses.WithLabelValues(name))
			wantLost := 0
			if tc.want == "lock lost" {
				wantLost = 1
			}
			if released != 1-wantLost || lost != wantLost || losses != float64(wantLost) {
				t.Fatalf("%d lock released, %d lock lost lines, lock losses %v; want one %q line and %d losses; logs:\n%s",
					released, lost, losses, tc.want, wantLost, logs)
			}
		})
	}
}

// After the caller stops, the work's context lives ShutdownTimeout longer:
// in-flight work finishes, then it is cut.
func TestShutdownTimeoutBoundsTheWork(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := b.seat(term.Options{TTL: 5 * time.Second, Wait: time.Second, ShutdownTimeout: 200 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	var cause error
	err := s.Run(ctx, 0, func(work context.Context, _ *term.Term) error {
		cancel()
		select {
		case <-work.Done():
			t.Fatal("work cancelled with the caller, want ShutdownTimeout later")
		case <-time.After(50 * time.Millisecond):
		}
		<-work.Done()
		cause = context.Cause(work)
		return nil
	})
	if err != nil || !errors.Is(cause, term.ErrShutdownTimeout) {
		t.Fatalf("Run %v, work's cause %v; want ErrShutdownTimeout", err, cause)
	}
	if n := b.rdb.Exists(context.Background(), b.prefix+name).Val(); n != 0 {
		t.Fatal("lock not released after a cancelled caller")
	}
}

// Not getting the lock is ErrNotAcquired, with the lock's reason kept.
func TestHeldElsewhereIsNotAcquired(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := b.seat(term.Options{TTL: 5 * time.Second, Wait: 100 * time.Millisecond})
	if err := b.rdb.Set(context.Background(), b.prefix+name, "someone", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	err := s.Run(context.Background(), 0, func(context.Context, *term.Term) error {
		t.Fatal("work ran without the lock")
		return nil
	})
	var h *lock.HolderError
	if !errors.Is(err, term.ErrNotAcquired) || !errors.As(err, &h) || h.Owner != "someone" {
		t.Fatalf("got %v, want ErrNotAcquired with the holder", err)
	}
}

// After Redis lost the lock's state (the floor lifted the counter), a seat
// that asks for it waits one TTL before raising the fence and working.
func TestWaitsOneTTLAfterDataLoss(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// The lock is renewed while the seat waits: each Redis call may take
	// TTL/10, and 60 ms (a TTL of 600 ms) was too little on a loaded
	// 2-core machine: the lease was lost, rightly, and the work never ran.
	const ttl = 3 * time.Second
	// Postgres accepted token 7; Redis' counter is gone.
	if err := b.st.ClaimFence(context.Background(), store.Fence{Lock: name, Token: 7, Owner: "before"}); err != nil {
		t.Fatal(err)
	}
	s := b.seat(term.Options{TTL: ttl, Wait: time.Minute, WaitAfterDataLoss: true})
	start := time.Now()
	var waited time.Duration
	ran := false
	err := s.Run(context.Background(), 0, func(_ context.Context, tm *term.Term) error {
		waited, ran = time.Since(start), true
		if tm.Token() <= 7 {
			t.Errorf("token %d, want above the floor 7", tm.Token())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !ran {
		t.Fatalf("the work never ran (the lease was lost while waiting); log:\n%s", b.logs.String())
	}
	if waited < ttl {
		t.Fatalf("work started %s after acquiring, want at least one TTL (%s)", waited, ttl)
	}
}
