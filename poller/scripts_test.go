package poller

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/keys"
	"github.com/outboxd/outboxd/internal/testenv"
)

// Redis restarted without its script cache (SCRIPT FLUSH here): claims and
// delivered marks go on, the scripts sent whole once.
func TestScriptCacheLossIsRecovered(t *testing.T) {
	e := setup(t)
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
