package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

var (
	consoleClients = flag.Int("console-clients", 1, "console: clients reading the console's overview (/ui) beside the drain")
	consoleEvery   = flag.Duration("console-every", time.Second, "console: how often each client reads /ui (and every fifth time /ui/dead)")
)

// ---- console ----

// consoleRounds drains -rows events per round and build twice: with the
// operations port idle, and with -console-clients clients reading the
// console's overview every -console-every all along (every fifth read
// the dead-letter page), as a browser left open and refreshed does. The
// goal: the drain beside the console takes at most 105% of the drain
// without.
func consoleRounds(ctx context.Context, bins []build) {
	type res struct{ alone, open []float64 }
	out := map[string]*res{}
	answers := map[string]string{}
	for r := range *rounds {
		for _, bin := range bins {
			x := out[bin.label]
			if x == nil {
				x = &res{}
				out[bin.label] = x
			}
			a := consoleOnce(ctx, bin.path, 0)
			c := consoleOnce(ctx, bin.path, *consoleClients)
			x.alone, x.open = append(x.alone, a.secs), append(x.open, c.secs)
			answers[bin.label] = c.answers()
			fmt.Printf("round %d %s: %d events drained in %.2f s alone (load %s), %.2f s beside %d console clients (load %s; %s; %d batch failures)\n",
				r+1, bin.label, *rows, a.secs, a.load, c.secs, *consoleClients, c.load, c.answers(), c.failures)
		}
	}
	fmt.Printf("\n| build | %d events, ops port idle: s min / median / max | beside %d console client(s) reading /ui every %s | ratio of medians | the console's answers (last round) | target |\n|---|---|---|---|---|---|\n",
		*rows, *consoleClients, *consoleEvery)
	for _, bin := range bins {
		x := out[bin.label]
		ratio := median(x.open) / median(x.alone)
		fmt.Printf("| %s | %s | %s | %.1f%% | %s | ≤ 105%% %s |\n", bin.label, mmmSecs(x.alone), mmmSecs(x.open), 100*ratio, answers[bin.label], tick(ratio <= 1.05))
	}
}

// consoleOnce starts a relay, starts clients reading its console,
// inserts -rows events and waits until the relay delivered them.
func consoleOnce(ctx context.Context, bin string, clients int) deadReadersResult {
	res := deadReadersResult{load: loadAvg()}
	r := newRun(ctx, bin)
	defer r.done()
	pool, err := pgxpool.New(ctx, r.dsn)
	check(err)
	defer pool.Close()
	tableAutovacuum(ctx, pool)
	d := startDaemon(ctx, bin, r.dsn, r.prefix, firstBatch(), false, []string{"dispatch.sink=noop"})
	defer d.stop()
	d.waitLeader()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var ok, refused, others atomic.Int64
	for range clients {
		wg.Go(func() { readConsole(d.addr, stop, &ok, &refused, &others) })
	}
	insertBacklog(ctx, pool, *rows)
	began := time.Now()
	for d.dispatched() < float64(*rows) {
		time.Sleep(100 * time.Millisecond)
		d.checkAlive()
	}
	close(stop)
	wg.Wait()
	var last time.Time
	check(pool.QueryRow(ctx, `SELECT max(dispatched_at) FROM outbox`).Scan(&last))
	res.secs = last.Sub(began).Seconds()
	res.ok, res.refused, res.others = ok.Load(), refused.Load(), others.Load()
	res.failures = strings.Count(d.logs.String(), "batch failed")
	return res
}

// readConsole reads /ui every -console-every (/ui/dead every fifth time)
// and its style sheet, until stop, counting the pages' answers.
func readConsole(addr string, stop <-chan struct{}, ok, refused, others *atomic.Int64) {
	client := &http.Client{Timeout: 30 * time.Second}
	tick := time.NewTicker(*consoleEvery)
	defer tick.Stop()
	for n := 0; ; n++ {
		page := "/ui"
		if n%5 == 4 {
			page = "/ui/dead"
		}
		for _, path := range []string{page, "/ui/static/console.css"} {
			resp, err := client.Get("http://" + addr + path)
			if err != nil {
				others.Add(1)
				continue
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			switch {
			case path != page:
			case resp.StatusCode == http.StatusOK:
				ok.Add(1)
			case resp.StatusCode == http.StatusServiceUnavailable:
				refused.Add(1)
			default:
				others.Add(1)
			}
		}
		select {
		case <-stop:
			return
		case <-tick.C:
		}
	}
}
