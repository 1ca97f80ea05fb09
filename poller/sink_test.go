package poller

import (
	"context"
	"errors"
	"sync"
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

func (e *env) pollerWith(cfg testCfg, sink dispatch.Sink) *runner {
	cfg.KeyPrefix = e.prefix
	m := metrics.New()
	locks := lock.New([]redis.UniversalClient{e.rdb}, lock.WithKeyPrefix(e.prefix), lock.WithHooks(term.Hooks(m)))
	log := testkit.Logger(e.t)
	return &runner{New(cfg.Config, Deps{Store: e.st, Locks: locks, Redis: e.rdb, Sink: sink, Log: log, Metrics: m}), m}
}

// The poller marks exactly what the sink said was delivered or a duplicate,
// counts failures (dead-lettering permanent ones, which do not block their
// aggregate), leaves not-attempted rows pending with nothing counted, and
// splits batches at the sink's MaxBatch without letting a failed aggregate
// go on in a later chunk.
func TestPollerMarksExactlyWhatTheSinkAcknowledged(t *testing.T) {
	e := newEnv(t)
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
	e := newEnv(t)
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
