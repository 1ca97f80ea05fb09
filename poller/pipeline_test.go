package poller

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/dispatch/webhook"
	"github.com/outboxd/outboxd/internal/testkit"
	"github.com/outboxd/outboxd/store"
)

// enqueue writes one event per aggregate id given ("deal/<id>"), in order.
func (e *testBundle) enqueue(aggs ...string) {
	e.t.Helper()
	ctx := context.Background()
	var evs []store.Event
	for _, a := range aggs {
		evs = append(evs, store.Event{AggregateType: "deal", AggregateID: a, EventType: "deal.funded", Payload: json.RawMessage(`{}`)})
	}
	if err := pgx.BeginFunc(ctx, e.st.Pool(), func(tx pgx.Tx) error { return store.Enqueue(ctx, tx, evs...) }); err != nil {
		e.t.Fatal(err)
	}
}

// slowPoller is a runner whose sends of a held event are not cut while a
// test waits (a minute at most): a lease and a webhook timeout of 5 minutes.
func (e *testBundle) slowPoller() *runner {
	cfg := testConfig()
	cfg.LockTTL = 5 * time.Minute
	sink, err := webhook.New(webhook.Config{URL: e.rc.URL(), Timeout: 5 * time.Minute, Concurrency: cfg.Concurrency})
	if err != nil {
		e.t.Fatal(err)
	}
	return e.pollerWith(cfg, sink)
}

// No batch-wide barrier: while one aggregate's first event is held at the
// receiver, other aggregates flow. An aggregate that failed in the slow
// one's batch has its failure written and is retried and delivered without
// waiting for it; aggregates inserted later are delivered and marked; the
// slow aggregate's own later rows, the one inserted after the hold too,
// wait behind it (nothing of it but the held event is sent), and afterwards
// it delivers in order.
func TestSlowAggregateHoldsOnlyItsOwnEvents(t *testing.T) {
	e := setup(t)
	release := e.rc.Hold(testkit.HoldAggregate("deal/slow"))
	e.rc.SetRespond(func(r testkit.Request) testkit.Reply {
		if r.Agg == "deal/fail" && r.Attempt == 1 {
			return testkit.Reply{Status: http.StatusServiceUnavailable}
		}
		return testkit.Reply{}
	})
	e.enqueue("slow", "fail", "slow", "slow") // one batch
	r := e.slowPoller()
	r.earlyWrite = time.Hour // the failure is written at once all the same
	e.run(r)
	e.waitFor("the slow aggregate's first event held", 30*time.Second, func() bool { return e.rc.Held() == 1 })
	e.enqueue("a", "slow", "b", "c", "d", "e")

	others := map[string]bool{"deal/fail": true, "deal/a": true, "deal/b": true, "deal/c": true, "deal/d": true, "deal/e": true}
	e.rc.Wait(t, 60*time.Second, "the other aggregates delivered while the slow one is held", func(reqs []testkit.Request) bool {
		n := 0
		for _, r := range reqs {
			if others[r.Agg] && r.OK() {
				n++
			}
		}
		return n == len(others)
	})
	e.waitFor("the others marked while the slow one is held", 60*time.Second, func() bool {
		return e.count("aggregate_id <> 'slow' AND dispatched_at IS NOT NULL") == len(others)
	})
	if held := e.rc.Held(); held != 1 {
		t.Fatalf("%d requests of the slow aggregate held, want only its first: a later event overtook it", held)
	}
	for _, r := range e.rc.Requests() {
		if r.Agg == "deal/slow" && !r.Held {
			t.Fatalf("event %d of the slow aggregate sent while its first is held", r.ID)
		}
	}
	release()
	e.waitAllDispatched(60 * time.Second)
	e.checkOrder()
}

// A batch's aggregates that went through are written (marked) while its
// slowest is still being sent, once that has taken earlyWrite.
func TestSettledAggregatesAreWrittenBesideTheSlowest(t *testing.T) {
	e := setup(t)
	release := e.rc.Hold(testkit.HoldAggregate("deal/slow"))
	defer release()
	e.enqueue("slow", "a", "b", "slow")
	r := e.slowPoller()
	r.earlyWrite = time.Millisecond
	e.run(r)
	e.waitFor("the co-batched aggregates marked while the slow one is held", 60*time.Second, func() bool {
		return e.count("aggregate_id <> 'slow' AND dispatched_at IS NOT NULL") == 2
	})
	if held := e.rc.Held(); held != 1 {
		t.Fatalf("%d requests of the slow aggregate held, want 1", held)
	}
	release()
	e.waitAllDispatched(60 * time.Second)
	e.checkOrder()
}

// A per-event sink with free slots gets the next batch while the last one
// is still sending: with both events of a full batch held at the receiver
// (and a poll interval no wait reaches), the next batch's aggregates are
// delivered and marked. Before, the lead waited for the held batch's
// sends to be over, or a poll interval.
func TestNextBatchFillsFreeSlots(t *testing.T) {
	e := setup(t)
	release := e.rc.Hold(func(r testkit.Request) bool { return r.Agg == "deal/a" || r.Agg == "deal/b" })
	defer release()
	e.enqueue("a", "b", "c", "d")
	r := e.slowPoller()
	r.cfg.BatchSize, r.cfg.PollInterval = 2, time.Hour // [a b] then [c d]; concurrency 8
	e.run(r)
	e.waitFor("c and d marked while a and b are held", 60*time.Second, func() bool {
		return e.count("aggregate_id IN ('c', 'd') AND dispatched_at IS NOT NULL") == 2
	})
	if held := e.rc.Held(); held != 2 {
		t.Fatalf("%d requests held, want a's and b's", held)
	}
	release()
	e.waitAllDispatched(60 * time.Second)
}

// slowWrites holds every batch's result write for d, so the next batch is
// fetched, claimed and sent while the previous one's results are not written.
func slowWrites(r *runner, d time.Duration) {
	r.hooks.beforeFinish = func() { time.Sleep(d) }
}

// The next batch leaves the rows of the batch still being written alone:
// without FetchLimits.Skip it would fetch them again, find its own earlier
// claims, take them over and send every row twice.
func TestNextBatchLeavesTheFinishingBatchAlone(t *testing.T) {
	e := setup(t)
	ids := e.insert(60, 60)
	cfg := testConfig()
	cfg.BatchSize = 10
	r := e.poller(cfg, "")
	slowWrites(r, 200*time.Millisecond)
	e.run(r)
	e.waitAllDispatched(30 * time.Second)
	if dups := e.checkDelivered(ids); dups != 0 {
		t.Fatalf("%d events sent twice while their batch's results were being written", dups)
	}
}

// A row that failed holds its aggregate while its failure is being written:
// the next batch waits for that write, so the aggregate's later rows do not
// look due and overtake it.
func TestFailureHoldsItsAggregateWhileItIsWritten(t *testing.T) {
	e := setup(t)
	ids := e.insert(6, 1) // one aggregate, one row per batch
	e.rc.SetRespond(func(r testkit.Request) testkit.Reply {
		if r.Attempt == 1 && r.ID == ids[0] {
			return testkit.Reply{Status: http.StatusServiceUnavailable}
		}
		return testkit.Reply{Status: http.StatusOK}
	})
	cfg := testConfig()
	cfg.BatchSize = 1
	r := e.poller(cfg, "")
	slowWrites(r, 300*time.Millisecond)
	e.run(r)
	e.waitAllDispatched(30 * time.Second)
	e.checkDelivered(ids)
	e.checkOrder()
}

// The rows fetched and not yet written stay within
// max(pipelineDepth × batch_size, 2 × the sink's Parallel): the next fetch
// waits (the pipeline is full) once a whole batch more would pass that,
// and until then asks for a whole batch that skips every row in flight.
// The pipeline is checked directly: a relay that stops fetching shows
// nothing to wait for, and flights still sending (a slow aggregate in
// each) are what the bound alone holds back (their settled rows are not
// writable before earlyWrite), so they are put in flight here as launch
// counts them, without sending.
func TestPipelineBoundsRowsFetchedAndNotWritten(t *testing.T) {
	for _, c := range []struct {
		name     string
		sink     dispatch.Sink
		batches  int // of 4 rows in flight with room for one more; one more fills it
		capacity int
	}{
		{"batch sink", dispatch.Noop{}, 3, 16},
		{"per-event sink, 4 at once", dispatch.PerEvent(nil, 4, dispatch.Capabilities{}), 3, 16},
		{"per-event sink, 16 at once", dispatch.PerEvent(nil, 16, dispatch.Capabilities{}), 7, 32},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := &Poller{cfg: Config{BatchSize: 4}.withDefaults(), sink: c.sink}
			pl := p.newPipeline(t.Context(), store.Fence{}, func() time.Time { return time.Now().Add(time.Minute) })
			t.Cleanup(func() {
				pl.mu.Lock()
				pl.flights, pl.unwritten = nil, 0 // nothing of them to write
				pl.mu.Unlock()
				_ = pl.close()
			})
			var ids []int64
			hold := func() {
				f := &flight{written: make([]bool, 4), left: 4, sending: true}
				for range 4 {
					ids = append(ids, int64(len(ids)+1))
					f.ids = append(f.ids, int64(len(ids)))
				}
				pl.mu.Lock()
				pl.flights, pl.unwritten = append(pl.flights, f), pl.unwritten+4
				pl.mu.Unlock()
			}
			for range c.batches {
				hold()
			}
			lim, ok := pl.limits()
			if !ok || lim.Rows != 4 || !slices.Equal(lim.Skip, ids) {
				t.Fatalf("%d rows in flight: limits %+v, %v; want a batch of 4 skipping %v", len(ids), lim, ok, ids)
			}
			hold()
			if lim, ok := pl.limits(); ok || !pl.full {
				t.Fatalf("%d rows in flight, room for %d: the next fetch may take %d more rows (full %v); want it to wait",
					len(ids), c.capacity, lim.Rows, pl.full)
			}
		})
	}
}

// A write that fails while the next fetch is under way brings its rows
// back above the cursor only after that fetch: the fetch skips them as in
// flight, and the one after reads them again. Heard of between the
// fetch's limits and its read, the rewind was undone by the read itself:
// it skipped the rows as still in flight and moved the cursor past them,
// unparked, and they waited for the slow rescan (minutes) to be marked.
func TestFailedWriteDuringTheNextFetchIsReadAgain(t *testing.T) {
	e := setup(t)
	ids := e.insert(2, 1) // one aggregate, one row per batch
	cfg := testConfig()
	cfg.BatchSize = 1
	r := e.poller(cfg, "")
	ctx := context.Background()
	exec := func(sql string) {
		t.Helper()
		if _, err := e.st.Pool().Exec(ctx, sql); err != nil {
			t.Error(err)
		}
	}
	var limits, writes atomic.Int32
	failed := make(chan struct{})
	// The first write (the first row's) fails: the table is away while it
	// runs, and back once it has failed. The second fetch waits for that
	// between taking its limits (the first row among them, in flight) and
	// reading.
	r.hooks.beforeFinish = func() {
		if writes.Load() == 0 {
			exec(`ALTER TABLE outbox RENAME TO outbox_away`)
		}
	}
	r.hooks.afterWrite = func() {
		if writes.Add(1) == 1 {
			exec(`ALTER TABLE outbox_away RENAME TO outbox`)
			close(failed)
		}
	}
	r.hooks.afterLimits = func() {
		if limits.Add(1) == 2 {
			select {
			case <-failed:
			case <-time.After(10 * time.Second):
				t.Error("the first write did not fail within 10s")
			}
		}
	}
	e.run(r)
	select { // the table is back before the count below looks at it
	case <-failed:
	case <-time.After(20 * time.Second):
		t.Fatal("the first write did not fail within 20s")
	}
	e.waitAllDispatched(20 * time.Second)
	e.checkDelivered(ids)
	e.checkOrder()
}
