package poller

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/keys"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/internal/testkit"
	"github.com/outboxd/outboxd/store"
)

// slowWrites holds every batch's result write for d, so the next batch is
// fetched, claimed and sent while the previous one's results are not written.
func slowWrites(r *runner, d time.Duration) {
	r.hooks.beforeFinish = func() { time.Sleep(d) }
}

// The next batch leaves the rows of the batch still being written alone:
// without FetchLimits.Skip it would fetch them again, find its own earlier
// claims, take them over and send every row twice.
func TestNextBatchLeavesTheFinishingBatchAlone(t *testing.T) {
	e := newEnv(t)
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
	e := newEnv(t)
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

// Redis restarted without its script cache (SCRIPT FLUSH here): claims and
// delivered marks go on, the scripts sent whole once.
func TestScriptCacheLossIsRecovered(t *testing.T) {
	e := newEnv(t)
	srv := testenv.StartRedisServer(t)
	e.rdb = srv.Client()
	first := e.insert(20, 5)
	r := e.poller(testConfig(), "")
	e.run(r)
	e.waitAllDispatched(30 * time.Second)
	if err := e.rdb.ScriptFlush(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	all := e.insert(20, 5)
	e.waitAllDispatched(30 * time.Second)
	if dups := e.checkDelivered(all); dups != 0 {
		t.Fatalf("%d duplicates", dups)
	}
	for _, id := range all[len(first):] {
		if v, err := e.rdb.Get(context.Background(), keys.New(e.prefix).Idempotency(id)).Result(); !strings.HasPrefix(v, "1:") {
			t.Fatalf("event %d's idempotency key is %q (%v) after the script cache was lost, want the delivered mark", id, v, err)
		}
	}
}

// claim.lua sent twice for one batch (a Cluster node answered NOSCRIPT and
// the pipeline was sent again) finds the batch's own claim on the keys the
// first run set: those rows are still the batch's to send, not another's.
func TestOwnClaimSeenAgainIsOurs(t *testing.T) {
	e := newEnv(t)
	e.insert(3, 3)
	r := e.poller(testConfig(), "")
	ctx := context.Background()
	rows, err := e.st.FetchDue(ctx, store.FetchLimits{Rows: 10})
	if err != nil || len(rows) != 3 {
		t.Fatalf("%d rows, %v", len(rows), err)
	}
	c := claimValue{token: 1, owner: "o", batch: "b"}
	for round := range 2 {
		items := make([]item, len(rows))
		for i, row := range rows {
			items[i].row = row
		}
		if err := r.claimKeys(ctx, items, c); err != nil {
			t.Fatal(err)
		}
		for _, it := range items {
			if it.outcome != pending {
				t.Fatalf("claim run %d: row %d outcome %d, want pending (ours to send)", round+1, it.row.ID, it.outcome)
			}
		}
	}
}
