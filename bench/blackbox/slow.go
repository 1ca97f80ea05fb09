package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

var (
	receiverDelay = flag.Duration("receiver-delay", 20*time.Millisecond, "slow: how long the webhook receiver takes to answer each event")
	slowAggs      = flag.Int("aggregates", 1000, "slow: aggregates the -rows events are spread over (round robin, by id); latency: aggregates the producers write to; drain, backlog, history: aggregates the backlog and the history are spread over (round robin)")
	stragglers    = flag.String("straggler", "0", "slow: the receiver takes this long for every event of one aggregate (\"0\"); 0: none; a comma list is run in turn (e.g. 0,500ms). A run ends when every other aggregate's events are delivered")
	slowConc      = flag.String("concurrency", "", "slow: poller.concurrency values, a comma list run in turn (empty: the build's default)")
	slowPad       = flag.Int("payload-bytes", payloadPad, "slow: padding per payload (about 50 bytes more each), for RSS with large payloads")
	slowBatchMax  = flag.String("batch-max-bytes", "", "slow: poller.batch_max_bytes (empty: the build's default)")
)

// stragglerID is the aggregate the receiver is slow for with -straggler.
const stragglerID = "0"

// slowRounds drains a -rows backlog over -aggregates aggregates through the
// webhook sink to a receiver that answers each event in -receiver-delay (a
// receiver in another region), for every build and -concurrency in turn.
// With -straggler, one aggregate's events take that long each: the others'
// throughput, and when each of them finished, shows whether it held them.
func slowRounds(ctx context.Context, bins []build) {
	concs := []string{""}
	if *slowConc != "" {
		concs = strings.Split(*slowConc, ",")
	}
	var strags []time.Duration
	for _, s := range strings.Split(*stragglers, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(s))
		check(err)
		strags = append(strags, d)
	}
	type key struct {
		bin, conc string
		strag     time.Duration
	}
	out := map[key][]slowResult{}
	for r := range *rounds {
		for _, c := range concs {
			c = strings.TrimSpace(c)
			for _, st := range strags {
				for _, bin := range bins {
					res := slowOnce(ctx, use(bin), c, st)
					k := key{bin.label, c, st}
					out[k] = append(out[k], res)
					fmt.Printf("round %d %s concurrency %s%s: %s (load %s)\n", r+1, bin.label, concWord(c), stragglerWord(st), res.describe(st), res.load)
				}
			}
		}
	}
	fmt.Printf("\n%d events over %d aggregates, receiver %v per event, %s payloads\n\n", *rows, *slowAggs, *receiverDelay, payloadWord())
	cores := runtime.NumCPU()
	fmt.Printf("| build | poller.concurrency | straggler | others ev/s min / median / max | others' per-aggregate finish p50 / max s (medians) | straggler events delivered by then | peak RSS MiB (max) | CPU s per 1k events relay / Postgres / Redis / receiver (medians) | CPU ceiling (%d cores) ev/s, all / receiver excluded | received twice / out of order (sum) |\n|---|---|---|---|---|---|---|---|---|---|\n", cores)
	for _, c := range concs {
		c = strings.TrimSpace(c)
		for _, st := range strags {
			for _, bin := range bins {
				var evs, p50, pmax, rss, cpu, pg, rd, rcv, strag []float64
				twice, early := 0, 0
				for _, x := range out[key{bin.label, c, st}] {
					evs, p50, pmax = append(evs, x.perSec), append(p50, x.finishP50), append(pmax, x.finishMax)
					rss, cpu, strag = append(rss, x.rssMiB), append(cpu, x.relayCPU), append(strag, float64(x.stragglerDone))
					pg, rd, rcv = append(pg, x.pgCPU), append(rd, x.redisCPU), append(rcv, x.rcvCPU)
					twice, early = twice+x.repeats, early+x.outOfOrder
				}
				// The ceiling: the cores over what an event costs, with and
				// without the receiver that shares them here.
				relay := median(cpu) + median(pg) + median(rd)
				fmt.Printf("| %s | %s | %s | %s | %.2f / %.2f | %.0f of %d | %.1f | %.4f / %.4f / %.4f / %.4f | %.0f / %.0f | %d / %d |\n", bin.label, concWord(c), strings.TrimPrefix(stragglerWord(st), ", "),
					mmm(evs), median(p50), median(pmax), median(strag), stragglerRows(st), slices.Max(rss), median(cpu), median(pg), median(rd), median(rcv),
					float64(cores)*1000/(relay+median(rcv)), float64(cores)*1000/relay, twice, early)
			}
		}
	}
}

func concWord(c string) string {
	if c == "" {
		return "default"
	}
	return c
}

func stragglerWord(strag time.Duration) string {
	if strag == 0 {
		return ", no straggler"
	}
	return fmt.Sprintf(", straggler %v per event", strag)
}

func payloadWord() string { return fmt.Sprintf("~%d-byte", *slowPad+50) }

// stragglerRows is how many of the backlog's rows are the straggler's.
func stragglerRows(strag time.Duration) int {
	if strag == 0 {
		return 0
	}
	return (*rows + *slowAggs - 1) / *slowAggs
}

type slowResult struct {
	load          string
	perSec        float64 // the other aggregates' events / (their last mark - process start)
	finishP50     float64 // s from the process start to each other aggregate's last mark: median
	finishMax     float64 // and the last
	stragglerDone int     // straggler events marked when the others were through
	repeats       int     // events the receiver got more than once
	outOfOrder    int     // events first received after a later one of their aggregate
	rssMiB        float64
	relayCPU      float64 // CPU s per 1,000 events marked
	pgCPU         float64 // Postgres' (serverCPU), likewise
	redisCPU      float64 // Redis', likewise
	rcvCPU        float64 // this process' (the receiver, on the same cores), likewise
}

func (r slowResult) describe(strag time.Duration) string {
	s := fmt.Sprintf("others %.0f ev/s, per-aggregate finish p50 %.2f s max %.2f s, peak RSS %.1f MiB, CPU s/1k events relay %.4f Postgres %.4f Redis %.4f receiver %.4f, %d received twice, %d out of order",
		r.perSec, r.finishP50, r.finishMax, r.rssMiB, r.relayCPU, r.pgCPU, r.redisCPU, r.rcvCPU, r.repeats, r.outOfOrder)
	if strag > 0 {
		s += fmt.Sprintf(", straggler %d of %d delivered by then", r.stragglerDone, stragglerRows(strag))
	}
	return s
}

func slowOnce(ctx context.Context, bin, conc string, strag time.Duration) slowResult {
	load := loadAvg()
	r := newRun(ctx, bin)
	defer r.done()
	pool, err := pgxpool.New(ctx, r.dsn)
	check(err)
	defer pool.Close()
	tableAutovacuum(ctx, pool)
	_, err = pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'deal', (i % @aggregates)::text, 'deal.funded', jsonb_build_object('seq', i, 'pad', repeat('x', @pad))
		FROM generate_series(1, @rows) i`, pgx.NamedArgs{"rows": *rows, "aggregates": *slowAggs, "pad": *slowPad})
	check(err)
	_, err = pool.Exec(ctx, `VACUUM ANALYZE outbox`)
	check(err)
	others := *rows - stragglerRows(strag)

	rcv := slowReceiver(strag)
	defer rcv.close()
	sets := []string{"dispatch.sink=webhook", "dispatch.webhook.url=" + rcv.url}
	if conc != "" {
		sets = append(sets, "poller.concurrency="+conc)
	}
	if *slowBatchMax != "" {
		sets = append(sets, "poller.batch_max_bytes="+*slowBatchMax)
	}
	pgBefore, redisBefore, selfBefore := serverCPU(ctx, pool), redisCPU(ctx, r.rdb), selfCPU()
	d := startDaemon(ctx, bin, r.dsn, r.prefix, *latBatch, *profile != "", sets)
	defer d.stop()
	if *profile != "" {
		defer d.cpuProfile(filepath.Join(*profile, fmt.Sprintf("slow-c%s-%s.cpu.pprof", concWord(conc), time.Now().Format("150405")))).wait()
	}
	for rcv.others.Load() < int64(others) {
		time.Sleep(100 * time.Millisecond)
		d.checkAlive()
	}
	for {
		var n int
		check(pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE dispatched_at IS NOT NULL AND aggregate_id <> @excluded`, pgx.NamedArgs{"excluded": slowExcluded(strag)}).Scan(&n))
		if n >= others {
			break
		}
		time.Sleep(100 * time.Millisecond)
		d.checkAlive()
	}
	res := slowResult{load: load, rssMiB: d.peakRSSMiB()}
	res.repeats, res.outOfOrder = rcv.counts()
	var finishes []float64
	rws, err := pool.Query(ctx, `SELECT extract(epoch FROM max(dispatched_at))::float8 FROM outbox
		WHERE aggregate_id <> @excluded GROUP BY aggregate_id`, pgx.NamedArgs{"excluded": slowExcluded(strag)})
	check(err)
	started := float64(d.started.UnixMicro()) / 1e6
	for rws.Next() {
		var at float64
		check(rws.Scan(&at))
		finishes = append(finishes, at-started)
	}
	check(rws.Err())
	slices.Sort(finishes)
	res.finishP50, res.finishMax = finishes[len(finishes)/2], finishes[len(finishes)-1]
	res.perSec = float64(others) / res.finishMax
	var marked int
	check(pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE aggregate_id = @straggler), count(*) FROM outbox WHERE dispatched_at IS NOT NULL`,
		pgx.NamedArgs{"straggler": stragglerID}).Scan(&res.stragglerDone, &marked))
	if strag == 0 {
		res.stragglerDone = 0
	}
	res.relayCPU = d.cpuSeconds() / (float64(marked) / 1000)
	res.pgCPU = (serverCPU(ctx, pool) - pgBefore) / (float64(marked) / 1000)
	res.redisCPU = (redisCPU(ctx, r.rdb) - redisBefore) / (float64(marked) / 1000)
	res.rcvCPU = (selfCPU() - selfBefore) / (float64(marked) / 1000)
	if logs := d.logs.String(); logs != "" {
		fmt.Fprintf(os.Stderr, "outboxd said:\n%s", logs)
	}
	return res
}

// slowExcluded is the aggregate left out of the others' figures: the
// straggler's, or none.
func slowExcluded(strag time.Duration) string {
	if strag > 0 {
		return stragglerID
	}
	return "none" // no aggregate has this id
}

type slowRecv struct {
	url    string
	others atomic.Int64 // 2xx answers to the other aggregates' events (repeats included)
	mu     sync.Mutex
	seen   map[int64]bool   // event ids answered
	last   map[string]int64 // per aggregate, the highest id answered
	repeat int              // requests for an id already answered
	early  int              // events first received after a later one of their aggregate
	close  func()
}

// counts are how many events the receiver got more than once, and how many
// it first got after a later event of their aggregate (order broken).
func (rc *slowRecv) counts() (repeats, outOfOrder int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.repeat, rc.early
}

// note records an answered event.
func (rc *slowRecv) note(id int64, agg string) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	switch {
	case rc.seen[id]:
		rc.repeat++
	case id < rc.last[agg]:
		rc.early++
	}
	rc.seen[id] = true
	rc.last[agg] = max(rc.last[agg], id)
}

// aggregateIn is the aggregate_id of a webhook body (the bench's ids need
// no unescaping).
func aggregateIn(body []byte) string {
	_, rest, _ := bytes.Cut(body, []byte(`"aggregate_id":"`))
	agg, _, _ := bytes.Cut(rest, []byte(`"`))
	return string(agg)
}

// slowReceiver answers every event after -receiver-delay (the straggler's,
// when strag is not 0, after strag) with a 200.
func slowReceiver(strag time.Duration) *slowRecv {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	rc := &slowRecv{url: "http://" + ln.Addr().String() + "/events", seen: map[int64]bool{}, last: map[string]int64{}}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		agg := aggregateIn(body)
		if strag > 0 && agg == stragglerID {
			time.Sleep(strag)
		} else {
			time.Sleep(*receiverDelay)
			rc.others.Add(1)
		}
		id, err := strconv.ParseInt(r.Header.Get("Idempotency-Key"), 10, 64)
		check(err)
		rc.note(id, agg)
		w.WriteHeader(http.StatusOK)
	})}
	go func() { _ = srv.Serve(ln) }()
	rc.close = func() { _ = srv.Close() }
	return rc
}

// selfCPU is this process' user+system CPU seconds so far (getrusage):
// the receiver's, the bench's own polling beside it being small.
func selfCPU() float64 {
	var ru syscall.Rusage
	check(syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}
