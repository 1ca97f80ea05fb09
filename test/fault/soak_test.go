package fault

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testkit"
)

var soak = flag.Duration("soak", 0, "run TestSoak for this long with random faults (e.g. -soak 30m)")

// TestSoak injects random faults into a running cluster for -soak, then
// checks every invariant once and prints a summary table. On demand only:
//
//	go test ./test/fault -run TestSoak -soak 30m -timeout 0
func TestSoak(t *testing.T) {
	if *soak == 0 {
		t.Skip("on demand: -soak DURATION")
	}
	c := newCluster(t, options{})
	c.startAll(3)
	c.leader()
	c.produce()
	start := time.Now()
	faults := map[string]func(){
		"kill -9 leader": func() {
			l := c.leader()
			c.signal(l, syscall.SIGKILL)
			<-c.reps[l].Done()
			c.start(l)
		},
		"SIGSTOP leader 2xTTL": func() {
			l := c.leader()
			c.signal(l, syscall.SIGSTOP)
			time.Sleep(2 * lockTTL)
			c.signal(l, syscall.SIGCONT)
		},
		"redis FLUSHALL": func() { _ = c.redis.Client().FlushAll(context.Background()).Err() },
		"redis restart":  func() { c.redis.Restart() },
		"receiver 503 5s": func() {
			c.rc.SetRespond(func(testkit.Request) testkit.Reply { return testkit.Reply{Status: http.StatusServiceUnavailable} })
			time.Sleep(5 * time.Second)
			c.rc.SetRespond(nil)
		},
		"SIGTERM + restart one": func() {
			i := rand.IntN(len(c.reps))
			c.signal(i, syscall.SIGTERM)
			<-c.reps[i].Done()
			c.start(i)
		},
	}
	names := make([]string, 0, len(faults))
	for n := range faults {
		names = append(names, n)
	}
	sort.Strings(names)
	counts := map[string]int{}
	for time.Since(start) < *soak {
		n := names[rand.IntN(len(names))]
		faults[n]()
		counts[n]++
		time.Sleep(time.Duration(3+rand.IntN(5)) * time.Second)
	}
	c.stopProducing()
	c.drain(2 * time.Minute)
	c.stopAll()
	rep := c.check(start, nil)

	fmt.Fprintf(os.Stderr, "\nsoak %s\n%-24s %6s\n", *soak, "fault", "count")
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "%-24s %6d\n", n, counts[n])
	}
	fmt.Fprintf(os.Stderr, "%-24s %6d\n%-24s %6d\n%-24s %6d\n%-24s %6d\n%-24s %6d\n%-24s %6d\n",
		"events", rep.events, "delivered", rep.delivered, "lost", rep.events-rep.delivered-rep.dead,
		"duplicates", rep.duplicates, "leaders (tokens)", rep.tokens, "fence rejections", rep.fenceRejected)
}
