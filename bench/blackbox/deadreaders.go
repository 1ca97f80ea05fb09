package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

var (
	deadRows    = flag.Int("dead", 200000, "dead-readers: dead rows the /dead readers filter through")
	deadReaders = flag.Int("readers", 32, "dead-readers: clients reading /dead?error=zzznotfound&limit=1000 one request after another")
)

// deadQuery walks every dead row: no last_error matches.
const deadQuery = "/dead?error=zzznotfound&limit=1000"

// ---- dead-readers ----

// deadReaderRounds drains -rows events per round and build twice: with
// the operations port idle, and with -readers clients reading deadQuery
// over -dead dead rows all along. A reader answered 503 waits the
// Retry-After it was given, as HTTP clients do. The goal: the drain with
// readers takes at most 110% of the drain without.
func deadReaderRounds(ctx context.Context, bins []build) {
	type res struct{ alone, crowd []float64 }
	out := map[string]*res{}
	answers := map[string]string{}
	for r := range *rounds {
		for _, bin := range bins {
			x := out[bin.label]
			if x == nil {
				x = &res{}
				out[bin.label] = x
			}
			a := deadReadersOnce(ctx, use(bin), 0)
			c := deadReadersOnce(ctx, use(bin), *deadReaders)
			x.alone, x.crowd = append(x.alone, a.secs), append(x.crowd, c.secs)
			answers[bin.label] = c.answers()
			fmt.Printf("round %d %s: %d events drained in %.2f s alone (load %s), %.2f s beside %d /dead readers (load %s; %s; %d batch failures)\n",
				r+1, bin.label, *rows, a.secs, a.load, c.secs, *deadReaders, c.load, c.answers(), c.failures)
		}
	}
	fmt.Printf("\n| build | %d events, ops port idle: s min / median / max | beside %d readers of `%s` over %d dead rows | ratio of medians | readers' answers (last round) | target |\n|---|---|---|---|---|---|\n",
		*rows, *deadReaders, deadQuery, *deadRows)
	for _, bin := range bins {
		x := out[bin.label]
		ratio := median(x.crowd) / median(x.alone)
		fmt.Printf("| %s | %s | %s | %.1f%% | %s | ≤ 110%% %s |\n", bin.label, mmmSecs(x.alone), mmmSecs(x.crowd), 100*ratio, answers[bin.label], tick(ratio <= 1.1))
	}
}

func mmmSecs(xs []float64) string {
	lo, hi := xs[0], xs[0]
	for _, x := range xs {
		lo, hi = min(lo, x), max(hi, x)
	}
	return fmt.Sprintf("%.2f / %.2f / %.2f", lo, median(xs), hi)
}

// deadReadersResult is one drain: its time from the backlog's commit to
// the last mark, and what the readers were answered.
type deadReadersResult struct {
	load                string
	secs                float64
	ok, refused, others int64
	failures            int // "batch failed" log lines
}

func (r deadReadersResult) answers() string {
	return fmt.Sprintf("%d × 200, %d × 503, %d other", r.ok, r.refused, r.others)
}

// deadReadersOnce starts a relay on -dead dead rows, starts readers
// clients, inserts -rows events and waits until the relay delivered them.
func deadReadersOnce(ctx context.Context, bin string, readers int) deadReadersResult {
	res := deadReadersResult{load: loadAvg()}
	r := newRun(ctx, bin)
	defer r.done()
	pool, err := pgxpool.New(ctx, r.dsn)
	check(err)
	defer pool.Close()
	tableAutovacuum(ctx, pool)
	_, err = pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, attempts, last_error, dead_at)
SELECT 'old', (g % 1000)::text, 'old.event', jsonb_build_object('pad', repeat('x', @pad)), 25, 'HTTP 500', now() - g * interval '1 second'
FROM generate_series(1, @rows::int) g`, pgx.NamedArgs{"rows": *deadRows, "pad": payloadPad})
	check(err)
	_, err = pool.Exec(ctx, `VACUUM ANALYZE outbox`)
	check(err)
	d := startDaemon(ctx, bin, r.dsn, r.prefix, firstBatch(), false, []string{"dispatch.sink=noop"})
	defer d.stop()
	d.waitLeader()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var ok, refused, others atomic.Int64
	for range readers {
		wg.Go(func() { readDead(d.addr, stop, &ok, &refused, &others) })
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

// readDead reads deadQuery one request after another until stop, counting
// the answers; after a 503 it waits its Retry-After (1 s if none).
func readDead(addr string, stop <-chan struct{}, ok, refused, others *atomic.Int64) {
	client := &http.Client{Timeout: 30 * time.Second}
	for {
		select {
		case <-stop:
			return
		default:
		}
		resp, err := client.Get("http://" + addr + deadQuery)
		if err != nil {
			others.Add(1)
			continue
		}
		_ = resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			ok.Add(1)
			continue
		case http.StatusServiceUnavailable:
			refused.Add(1)
		default:
			others.Add(1)
		}
		wait := time.Second
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil {
			wait = time.Duration(s) * time.Second
		}
		select {
		case <-stop:
			return
		case <-time.After(wait):
		}
	}
}
