package blackbox

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// The built binary, two producers on one aggregate without a lock: the
// lower id commits after poller.gap_wait. The higher goes first; the lower
// is delivered all the same, logged at WARN "late commit" with both ids,
// and outboxd_late_commits_total says 1.
func TestLateCommitIsWarnedAndCounted(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rc := newRecorder(t, nil)
	// One term throughout: a new holder does not know what the last one
	// sent, so a late commit across terms is not warned (poller
	// readpath.go, "Not guaranteed"); a 2 s lease can move on a loaded
	// machine.
	e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", rc.URL(), "OUTBOXD_POLLER_GAP_WAIT", "300ms", "OUTBOXD_POLLER_LOCK_TTL", "30s")
	rep := e.start()
	ctx := context.Background()
	// The relay reads before the race starts: one that computes its first
	// cursor while a producer is in flight finds that row by its rescan, not
	// as a late commit (poller TestFirstCursorWaitsForProducersInFlight).
	warm := e.insert("deal", "warm", `{}`, "")
	waitFor(t, "the relay delivering", func() bool { return rc.OKCounts()[warm] > 0 }, e.describeRows("true"))

	slow, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = slow.Rollback(ctx) }()
	var lower int64
	if err := slow.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		VALUES ('deal', 'A', 'test.event', '{}') RETURNING id`).Scan(&lower); err != nil {
		t.Fatal(err)
	}
	higher := e.insert("deal", "A", `{}`, "")
	waitFor(t, "the higher id delivered past gap_wait", func() bool { return rc.OKCounts()[higher] > 0 }, e.describeRows("true"))
	if err := slow.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the late row delivered", func() bool { return rc.OKCounts()[lower] > 0 }, e.describeRows("true"))
	if terms := rep.logsMatching(func(_ string, rec map[string]any) bool {
		return rec["msg"] == "lock acquired" && rec["lock"] == "lock:outbox:poller"
	}); len(terms) != 1 {
		t.Fatalf("%d poller terms, want one (the test's premise); last lines:\n%s", len(terms), rep.tail(20))
	}
	if !rep.awaitLog(10*time.Second, func(_ string, rec map[string]any) bool {
		return rec["msg"] == "late commit" && rec["level"] == "WARN" && rec["aggregate_type"] == "deal" &&
			rec["aggregate_id"] == "A" && rec["outbox_id"] == float64(lower) && rec["after_id"] == float64(higher)
	}) {
		t.Fatalf("no late commit WARN naming %d after %d; last lines:\n%s", lower, higher, rep.tail(20))
	}
	resp, err := http.Get("http://" + rep.addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if !strings.Contains(string(body), "\noutboxd_late_commits_total 1\n") {
		t.Fatalf("metrics lack outboxd_late_commits_total 1:\n%s", grepLines(string(body), "late_commits"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return fmt.Sprint(out)
}
