package poller

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/internal/metrics"
	"github.com/outboxd/outboxd/internal/term"
	"github.com/outboxd/outboxd/internal/testkit"
	"github.com/outboxd/outboxd/lock/redislease"
	"github.com/outboxd/outboxd/store"
)

// deliver's bookkeeping is a fixed number of allocations per batch, not
// one per aggregate or per row: a batch of 1,000 rows over 1,000
// aggregates (one event per order) costs the same few slices as one over
// 10. Each aggregate's rows grown by append were an allocation per
// aggregate, a fifth of deliver's bytes in a drain.
func TestDeliverAllocatesPerBatch(t *testing.T) {
	p := New(Config{}, Deps{Sink: dispatch.Noop{}, Log: slog.New(slog.DiscardHandler)})
	trusted := func() time.Time { return time.Now().Add(time.Hour) }
	for _, aggs := range []int{10, 1000} {
		items := make([]item, 1000)
		for i := range items {
			items[i].row = store.Row{ID: int64(i + 1), AggregateType: "deal", AggregateID: strconv.Itoa(i % aggs), EventType: "deal.funded"}
		}
		n := testing.AllocsPerRun(5, func() {
			for i := range items {
				items[i].outcome = pending
			}
			p.deliver(context.Background(), items, 1, trusted, func([][]int) {})
		})
		t.Logf("%d aggregates: %.0f allocations per batch of 1,000", aggs, n)
		if n > 100 {
			t.Errorf("%d aggregates: %.0f allocations per batch of 1,000, want at most 100", aggs, n)
		}
	}
}

// scripted is a batch sink that answers each event as told by its
// aggregate id, records the batches it got, and keeps the contract: per
// aggregate, nothing after the first failure.
type scripted struct {
	mu      sync.Mutex
	answer  map[string]dispatch.Outcome // by aggregate id; Delivered if absent
	batches [][]int64
	caps    dispatch.Capabilities
	dedupe  map[int64]string // each event's DedupeID, by id, when set
}

func (s *scripted) Capabilities() dispatch.Capabilities { return s.caps }

func (s *scripted) Send(_ context.Context, b dispatch.Batch) []dispatch.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []int64
	out := make([]dispatch.Result, len(b.Events))
	stopped := map[string]bool{}
	for i, ev := range b.Events {
		ids = append(ids, ev.ID)
		if s.dedupe != nil {
			s.dedupe[ev.ID] = ev.DedupeID()
		}
		if stopped[ev.AggregateID] {
			continue // NotAttempted
		}
		o, ok := s.answer[ev.AggregateID]
		if !ok {
			o = dispatch.Delivered
		}
		out[i] = dispatch.Result{Outcome: o, Ref: "ref"}
		if o == dispatch.Retryable || o == dispatch.Permanent {
			out[i].Err = errors.New("scripted " + o.String())
			stopped[ev.AggregateID] = true
		}
	}
	s.batches = append(s.batches, ids)
	return out
}

func (e *testBundle) pollerWith(cfg testCfg, sink dispatch.Sink) *runner {
	cfg.KeyPrefix = e.prefix
	m := metrics.New()
	locks := redislease.New([]redis.UniversalClient{e.rdb}, redislease.WithKeyPrefix(e.prefix), redislease.WithHooks(term.Hooks(m)))
	log := testkit.Logger(e.t)
	return &runner{New(cfg.Config, Deps{Store: e.st, Locks: locks, Redis: e.rdb, Sink: sink, Log: log, Metrics: m}), m}
}

// The poller marks exactly what the sink said was delivered or a duplicate,
// counts failures (dead-lettering permanent ones, which do not block their
// aggregate), leaves not-attempted rows pending with nothing counted, and
// splits batches at the sink's MaxBatch without letting a failed aggregate
// go on in a later chunk.
func TestPollerMarksExactlyWhatTheSinkAcknowledged(t *testing.T) {
	e := setup(t)
	e.insert(40, 4) // deal/0 .. deal/3, 10 rows each, interleaved
	sink := &scripted{
		answer: map[string]dispatch.Outcome{"1": dispatch.Duplicate, "2": dispatch.Retryable, "3": dispatch.Permanent},
		caps:   dispatch.Capabilities{MaxBatch: 7},
	}
	cfg := testConfig()
	cfg.BackoffBase, cfg.BackoffMax = time.Hour, time.Hour // a retried row stays put
	r := e.pollerWith(cfg, sink)
	e.run(r)
	e.waitFor("deal/0 and deal/1 marked, deal/2 retrying, deal/3 dead", 10*time.Second, func() bool {
		return e.count("dispatched_at IS NOT NULL") == 20 && e.count("dead_at IS NOT NULL") == 10
	})
	if n := e.count("aggregate_id IN ('0','1') AND dispatched_at IS NOT NULL"); n != 20 {
		t.Fatalf("%d delivered/duplicate rows marked, want 20", n)
	}
	if n := e.count("aggregate_id = '2' AND attempts = 1 AND dead_at IS NULL AND last_error LIKE 'scripted retryable%'"); n != 1 {
		t.Fatalf("deal/2: %d rows with one retryable attempt, want its first row only", n)
	}
	if n := e.count("aggregate_id = '3' AND dead_at IS NOT NULL AND attempts = 1 AND last_error LIKE 'scripted permanent%'"); n != 10 {
		t.Fatalf("deal/3: %d rows dead after one attempt each, want all 10", n)
	}
	if n := e.count("aggregate_id = '2' AND attempts = 0 AND dispatched_at IS NULL AND dead_at IS NULL"); n != 9 {
		t.Fatalf("%d later rows of deal/2 untouched behind its backoff, want 9", n)
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	for _, b := range sink.batches {
		if len(b) > 7 {
			t.Fatalf("a batch of %d events, above MaxBatch 7", len(b))
		}
	}
	// deal/2's first row (id 3) failed in the first chunk, which also held
	// its second (id 7: the sink's to leave not attempted). No later chunk
	// carried deal/2 (ids 3, 7, 11, ... 39): the poller stopped it.
	for n, b := range sink.batches {
		for _, id := range b {
			if id%4 == 3 && n > 0 {
				t.Fatalf("deal/2's row %d sent in chunk %d after the aggregate failed: batches %v", id, n, sink.batches)
			}
		}
	}
}

// A sink that breaks its contract (a wrong number of results) gets nothing
// marked and nothing counted.
func TestWrongNumberOfResultsMarksNothing(t *testing.T) {
	e := setup(t)
	e.insert(5, 5)
	sink := &brokenSink{}
	r := e.pollerWith(testConfig(), sink)
	e.run(r)
	e.waitFor("three batches answered wrongly", 10*time.Second, func() bool { return sink.calls.Load() >= 3 })
	if n := e.count("dispatched_at IS NOT NULL OR attempts > 0"); n != 0 {
		t.Fatalf("%d rows changed on a broken answer", n)
	}
}

type brokenSink struct{ calls atomic.Int32 }

func (*brokenSink) Capabilities() dispatch.Capabilities { return dispatch.Capabilities{} }

func (b *brokenSink) Send(context.Context, dispatch.Batch) []dispatch.Result {
	b.calls.Add(1)
	return []dispatch.Result{{Outcome: dispatch.Delivered}}
}

// A destination that holds the send without a final answer until the lease
// cuts it (Result.Unanswered) costs an attempt every time, the first
// included: with max_attempts 2 the row is dead after 2 sends, not 4. A
// send cut because the lease itself was lost counts no attempt (cutShort:
// the cut is ours): under load a 1 s lease was lost once and the row took
// 3 sends, so each such send, logged "send abandoned", is counted apart.
func TestHeldSendsCountFromTheFirstCut(t *testing.T) {
	e := setup(t)
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
	locks := redislease.New([]redis.UniversalClient{e.rdb}, redislease.WithKeyPrefix(e.prefix), redislease.WithHooks(term.Hooks(m)))
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

// A receiver slower than the lease: the send is cut by the trust deadline
// while the lease is still held. Once is forgiven; the second cut of the same
// row counts as an attempt, with a WARN each time, so the row dead-letters
// instead of retrying forever.
func TestSendsCutByTheLeaseCountAsAttempts(t *testing.T) {
	e := setup(t)
	e.insert(1, 1)
	hang := dispatch.PerEvent(func(ctx context.Context, _ dispatch.Event, _ int64) error {
		<-ctx.Done() // never answers: each send ends only with its context
		return ctx.Err()
	}, 1, dispatch.Capabilities{})
	cfg := testConfig()
	cfg.LockTTL, cfg.MaxAttempts, cfg.KeyPrefix = time.Second, 2, e.prefix
	var logs testkit.Logs
	m := metrics.New()
	locks := redislease.New([]redis.UniversalClient{e.rdb}, redislease.WithKeyPrefix(e.prefix), redislease.WithHooks(term.Hooks(m)))
	p := New(cfg.Config, Deps{Store: e.st, Locks: locks, Redis: e.rdb, Sink: hang, Log: slog.New(slog.NewJSONHandler(&logs, nil)), Metrics: m})
	e.run(&runner{p, m})
	e.waitFor("the row dead-lettered", 20*time.Second, func() bool { return e.count("dead_at IS NOT NULL") == 1 })
	if n := e.count("attempts = 2 AND last_error LIKE '%cut short by the lock''s trust deadline%'"); n != 1 {
		t.Fatal("the dead row does not say its sends were cut by the lease")
	}
	if got := strings.Count(logs.String(), `"msg":"send cut short by the lease"`); got < 4 {
		t.Fatalf("%d WARN lines for 4 cut sends:\n%s", got, logs.String())
	}
	if testutil.ToFloat64(m.SendsCut) < 4 {
		t.Fatalf("outboxd_sends_cut_total %v, want >= 4", testutil.ToFloat64(m.SendsCut))
	}
}
