package main

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

var (
	historyRows   = flag.Int("history", 1000000, "history: settled rows the -rows pending ones sit behind")
	smallRows     = flag.Int("small", 100000, "backlog: the backlog -rows is compared with")
	lates         = flag.String("late", "2s", "order: how long after the higher id the lower one commits, a comma list (one probe each)")
	warm          = flag.Bool("warm", false, "history, backlog: start the relay first, wait until it delivered one event written after any history, then insert the backlog and time from its commit (a running relay, not a restart onto a backlog; no VACUUM before the drain)")
	stuckRow      = flag.Bool("stuck-row", false, "history: the history's first row backs off for an hour (a relay with no cursor saved starts below it; its late-commit check spans the history)")
	historyCkpt   = flag.Bool("history-checkpoint", false, "history: CHECKPOINT after writing the settled rows, so the drain does not pay for flushing the history's own dirty pages (a history that was there before, not one written a second ago)")
	historyCursor = flag.String("history-cursor", "none", "history: none (no cursor saved: the relay starts as on its first start and finds the lowest pending row by walking the pending index, the history's entries included) or saved (the cursor a relay that delivered the history saved: at its last id)")
	historySettle = flag.String("history-settle", "batches", "history: how the settled rows are marked dispatched: batches (a snapshot opened after their INSERT, then UPDATEs of 1,000 ids, as a relay writes) or bulk (VACUUM ANALYZE, the snapshot, one UPDATE)")
	asWritten     = flag.Bool("as-written", false, "drain, history, backlog: start the relay (or the bare protocol) on the table as the inserts left it: no CHECKPOINT before the backlog's insert and no VACUUM ANALYZE after it (default: both, so no checkpoint runs while timed and every row has its hint bits set)")
	rollback      = flag.Bool("rollback", true, "order: also a probe whose lower id rolls back (a gap that never fills) after the first -late")
)

// ---- history ----

// historyRounds drains -rows pending events twice per round and build: on a
// clean (vacuumed) table, and behind -history settled rows whose old
// versions a held snapshot keeps (they were marked dispatched while it was
// open, and it stays open during the drain), so their entries stay in the
// pending index for every fetch to walk.
func historyRounds(ctx context.Context, bins []build) {
	type res struct{ clean, behind, cleanCkpt, behindCkpt []float64 }
	out := map[string]*res{}
	for r := range *rounds {
		for _, bin := range bins {
			x := out[bin.label]
			if x == nil {
				x = &res{}
				out[bin.label] = x
			}
			c := drainOutboxd(ctx, use(bin), "noop", firstBatch(), *rows, "clean", nil)
			x.clean, x.cleanCkpt = append(x.clean, c.perSec), append(x.cleanCkpt, c.checkpointing)
			fmt.Printf("round %d %s: %d pending on a clean table: %8.0f ev/s, checkpoint running %.0f%% (load %s)\n",
				r+1, bin.label, *rows, c.perSec, 100*c.checkpointing, c.load)
			h := drainOutboxd(ctx, use(bin), "noop", firstBatch(), *rows, "history", settledHistory(ctx))
			x.behind, x.behindCkpt = append(x.behind, h.perSec), append(x.behindCkpt, h.checkpointing)
			fmt.Printf("round %d %s: %d pending behind %d settled, snapshot held: %8.0f ev/s, checkpoint running %.0f%% (load %s), %.1f%% of clean\n",
				r+1, bin.label, *rows, *historyRows, h.perSec, 100*h.checkpointing, h.load, 100*h.perSec/c.perSec)
		}
	}
	fmt.Printf("\n%s\n\n| build | %d pending, clean table, ev/s min / median / max | behind %d settled rows, snapshot held | ratio of medians | target | checkpoint running, share of the drain by round: clean / held |\n|---|---|---|---|---|---|\n", historyMethod(), *rows, *historyRows)
	for _, bin := range bins {
		x := out[bin.label]
		ratio := median(x.behind) / median(x.clean)
		fmt.Printf("| %s | %s | %s | %.1f%% | ≥ 80%% %s | %s / %s |\n", bin.label, mmm(x.clean), mmm(x.behind), 100*ratio, tick(ratio >= 0.8),
			percents(x.cleanCkpt), percents(x.behindCkpt))
	}
}

// percents is shares as whole percentages, comma-separated.
func percents(xs []float64) string {
	p := make([]string, len(xs))
	for i, x := range xs {
		p[i] = fmt.Sprintf("%.0f%%", 100*x)
	}
	return strings.Join(p, ", ")
}

// historyMethod says how the history runs were made, for the result.
func historyMethod() string {
	start := "relay started onto the backlog, timed from its process start to the last row's mark"
	if *warm {
		start = "relay running first, timed from the backlog's commit"
	}
	prep := "CHECKPOINT before the backlog's insert, VACUUM ANALYZE after it"
	if *asWritten {
		prep = "no CHECKPOINT or VACUUM between the inserts and the start"
	}
	settle := "settled in UPDATEs of 1,000 ids with a snapshot opened before them"
	if *historySettle == "bulk" {
		settle = "settled by one UPDATE after a VACUUM, the snapshot opened between"
	}
	cursor := "no cursor saved (a first start: the relay walks the pending index, the history's entries included, for the lowest pending row)"
	if *historyCursor == "saved" {
		cursor = "the cursor saved at the history's last id (a restart of the relay that delivered it)"
	}
	return fmt.Sprintf("History %s; %s; %s; %s.", settle, cursor, prep, start)
}

// settledHistory writes -history events and settles them with a snapshot
// held from before the settling until the drain is timed, so neither the
// old versions nor their pending-index entries can be vacuumed. With
// -history-settle batches (the default), the snapshot is opened right after
// the one INSERT of the history, and the history is then marked dispatched
// in id order, 1,000 ids per UPDATE, each its own transaction, with the
// statement shape of outboxd's own write (UPDATE ... WHERE id = ANY(ids) AND
// dispatched_at IS NULL, asynchronous commit): the pages are left as a
// relay leaves them, hint bits unset, nothing vacuumed, no checkpoint (with
// -as-written). No cursor is saved: the relay starts below the history, as
// on its first start. -history-settle bulk is the earlier method: VACUUM
// ANALYZE, the snapshot, then one UPDATE of every row.
func settledHistory(ctx context.Context) func(*pgxpool.Pool) func() {
	return func(pool *pgxpool.Pool) func() {
		began := time.Now()
		insertBacklog(ctx, pool, *historyRows)
		var release func()
		switch *historySettle {
		case "bulk":
			_, err := pool.Exec(ctx, `VACUUM ANALYZE outbox`)
			check(err)
			release = holdSnapshotOpen(ctx, pool.Config().ConnString())
			_, err = pool.Exec(ctx, `UPDATE outbox SET dispatched_at = now(), attempts = 1`)
			check(err)
		case "batches":
			release = holdSnapshotOpen(ctx, pool.Config().ConnString())
			settleInBatches(ctx, pool)
		default:
			check(fmt.Errorf("-history-settle %q: want batches or bulk", *historySettle))
		}
		if *historyCkpt {
			_, err := pool.Exec(ctx, `CHECKPOINT`)
			check(err)
		}
		saveHistoryCursor(ctx, pool)
		if *stuckRow {
			// One row of the history backs off: a relay with no cursor
			// saved starts below it, the whole history in the range it
			// checks for late commits across the change of holder. An
			// aggregate of its own: the backlog's rows wait for none.
			_, err := pool.Exec(ctx, `UPDATE outbox SET dispatched_at = NULL, available_at = now() + interval '1 hour',
				aggregate_id = 'stuck' WHERE id = (SELECT min(id) FROM outbox)`)
			check(err)
		}
		fmt.Printf("    %d settled rows written (%s) in %.1f s\n", *historyRows, *historySettle, since(began)/1000)
		return release
	}
}

// saveHistoryCursor, with -history-cursor saved, stores the cursor a relay
// that delivered the history would have left: at its last id, in this
// epoch (store/cursor.sql, epoch), nothing owed.
func saveHistoryCursor(ctx context.Context, pool *pgxpool.Pool) {
	switch *historyCursor {
	case "none":
		return
	case "saved":
	default:
		check(fmt.Errorf("-history-cursor %q: want none or saved", *historyCursor))
	}
	_, err := pool.Exec(ctx, `INSERT INTO outbox_cursor (lock_name, cursor, epoch, sent, horizon)
		SELECT 'lock:outbox:poller', max(id), pg_relation_filenode('outbox'::regclass)::text || '/' ||
			COALESCE(pg_relation_filenode(pg_get_serial_sequence('outbox', 'id')::regclass)::text, ''), max(id), 0
		FROM outbox`)
	check(err)
}

// settleInBatches marks every row dispatched, 1,000 ids per statement in
// id order, each statement its own transaction, as a relay's writes do.
func settleInBatches(ctx context.Context, pool *pgxpool.Pool) {
	var lo, hi int64
	check(pool.QueryRow(ctx, `SELECT min(id), max(id) FROM outbox`).Scan(&lo, &hi))
	ids := make([]int64, 0, 1000)
	for from := lo; from <= hi; from += 1000 {
		ids = ids[:0]
		for id := from; id < from+1000 && id <= hi; id++ {
			ids = append(ids, id)
		}
		_, err := pool.Exec(ctx, `WITH async AS (SELECT set_config('synchronous_commit', 'off', true))
			UPDATE outbox SET dispatched_at = now(), last_error = NULL
			WHERE id = ANY(@ids::bigint[]) AND dispatched_at IS NULL AND EXISTS (SELECT FROM async)`, pgx.NamedArgs{"ids": ids})
		check(err)
	}
}

func firstBatch() int {
	n, err := strconv.Atoi(strings.TrimSpace(strings.Split(*batches, ",")[0]))
	check(err)
	return n
}

func tick(ok bool) string {
	if ok {
		return "✔"
	}
	return "✘"
}

// ---- backlog ----

// backlogRounds drains a -small backlog and a -rows one per round and
// build, and compares the rates.
func backlogRounds(ctx context.Context, bins []build) {
	type res struct{ small, big, ratio []float64 }
	out := map[string]*res{}
	for r := range *rounds {
		for _, bin := range bins {
			x := out[bin.label]
			if x == nil {
				x = &res{}
				out[bin.label] = x
			}
			s := drainOutboxd(ctx, use(bin), "noop", firstBatch(), *smallRows, "small", nil)
			b := drainOutboxd(ctx, use(bin), "noop", firstBatch(), *rows, "big", nil)
			x.small, x.big, x.ratio = append(x.small, s.perSec), append(x.big, b.perSec), append(x.ratio, b.perSec/s.perSec)
			fmt.Printf("round %d %s: %d backlog %8.0f ev/s (load %s), %d backlog %8.0f ev/s (load %s): %.1f%%\n",
				r+1, bin.label, *smallRows, s.perSec, s.load, *rows, b.perSec, b.load, 100*b.perSec/s.perSec)
		}
	}
	fmt.Printf("\n| build | %d backlog ev/s min / median / max | %d backlog ev/s | ratio of medians | target |\n|---|---|---|---|---|\n", *smallRows, *rows)
	for _, bin := range bins {
		x := out[bin.label]
		ratio := median(x.big) / median(x.small)
		fmt.Printf("| %s | %s | %s | %.1f%% | ≥ 85%% %s |\n", bin.label, mmm(x.small), mmm(x.big), 100*ratio, tick(ratio >= 0.85))
	}
}

// ---- order ----

// orderProbes runs, per run and build, one probe per -late (and one with a
// rollback): two transactions on one aggregate, the lower id committing (or
// rolling back) -late after the higher one, while other aggregates keep
// producing; it reports the order the webhook receiver saw and what the
// relay said about it.
func orderProbes(ctx context.Context, bins []build) {
	var ds []time.Duration
	for _, s := range strings.Split(*lates, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(s))
		check(err)
		ds = append(ds, d)
	}
	for r := range *runs {
		for _, bin := range bins {
			for _, d := range ds {
				orderProbe(ctx, r+1, bin, d, false)
			}
			if *rollback {
				orderProbe(ctx, r+1, bin, ds[0], true)
			}
		}
	}
}

func orderProbe(ctx context.Context, run int, bin build, late time.Duration, rollBack bool) {
	load := loadAvg()
	r := newRun(ctx, use(bin))
	defer r.done()
	pool, err := pgxpool.New(ctx, r.dsn)
	check(err)
	defer pool.Close()
	tableAutovacuum(ctx, pool)
	got, sink, stop := arrivalReceiver()
	defer stop()
	d := startDaemon(ctx, use(bin), r.dsn, r.prefix, *latBatch, false, sink)
	defer d.stop()
	d.waitLeader()

	txA, err := pool.Begin(ctx)
	check(err)
	var idA, idB int64
	check(txA.QueryRow(ctx, probeInsert, pgx.NamedArgs{"aggregate": "probe"}).Scan(&idA))
	txB, err := pool.Begin(ctx)
	check(err)
	check(txB.QueryRow(ctx, probeInsert, pgx.NamedArgs{"aggregate": "probe"}).Scan(&idB))
	check(txB.Commit(ctx))
	atB := time.Now()

	// Other aggregates keep producing, one event every 20 ms, while the
	// lower id is open and for as long again after it ends.
	type other struct {
		id int64
		at time.Time
	}
	var others []other
	var mu sync.Mutex
	bgCtx, bgStop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-bgCtx.Done():
				return
			case <-t.C:
			}
			var id int64
			check(pool.QueryRow(ctx, probeInsert, pgx.NamedArgs{"aggregate": fmt.Sprintf("other-%d", i%100)}).Scan(&id))
			mu.Lock()
			others = append(others, other{id, time.Now()})
			mu.Unlock()
		}
	})
	time.Sleep(late) // the scenario itself: the lower id's transaction stays open this long
	if rollBack {
		check(txA.Rollback(ctx))
	} else {
		check(txA.Commit(ctx))
	}
	atA := time.Now()
	time.Sleep(late)
	bgStop()
	wg.Wait()

	want := []int64{idB}
	if !rollBack {
		want = append(want, idA)
	}
	for _, o := range others {
		want = append(want, o.id)
	}
	deadline := time.Now().Add(late + 2*time.Minute)
	for {
		missing := 0
		for _, id := range want {
			if got.first(id).IsZero() {
				missing++
			}
		}
		if missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			check(fmt.Errorf("order probe: %d of %d events not received after %v\n%s", missing, len(want), late+2*time.Minute, d.logs))
		}
		d.checkAlive()
		time.Sleep(20 * time.Millisecond)
	}

	ms := func(a, b time.Time) float64 { return float64(a.Sub(b).Microseconds()) / 1000 }
	var bg []float64
	for _, o := range others {
		bg = append(bg, ms(got.first(o.id), o.at))
	}
	q := quantilesOf(bg)
	order := got.order(idA, idB)
	verdict := "in id order"
	if len(order) == 2 && order[0] == idB {
		verdict = "OUT OF ORDER"
	}
	what := fmt.Sprintf("id %d commits %v after id %d", idA, late, idB)
	aLine := fmt.Sprintf("%d commit → received %.1f ms", idA, ms(got.first(idA), atA))
	if rollBack {
		what = fmt.Sprintf("id %d rolls back %v after id %d commits", idA, late, idB)
		verdict, aLine = "rolled back", "never delivered (rolled back)"
	}
	warned := strings.Contains(d.logs.String(), "late commit")
	fmt.Printf("run %d %s: %s (load %s): received %v, %s; %d commit → received %.1f ms; %s; other aggregates (%d events) commit → received p50 %.1f p99 %.1f max %.1f ms; outboxd_late_commits_total %.0f; WARN \"late commit\" logged: %v\n",
		run, bin.label, what, load, order, verdict, idB, ms(got.first(idB), atB), aLine, q.n, q.p50, q.p99, q.max, d.metricSum("outboxd_late_commits_total"), warned)
}

const probeInsert = `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
	VALUES ('deal', @aggregate, 'deal.probe', '{}') RETURNING id`

// metricSum adds every sample of a metric, whatever its labels (0 when the
// build does not have it).
func (d *daemon) metricSum(name string) float64 {
	total := 0.0
	for _, line := range d.metricLines() {
		if rest, ok := strings.CutPrefix(line, name); ok && (strings.HasPrefix(rest, " ") || strings.HasPrefix(rest, "{")) {
			f := strings.Fields(rest[strings.LastIndexByte(rest, '}')+1:])
			if len(f) > 0 {
				v, _ := strconv.ParseFloat(f[0], 64)
				total += v
			}
		}
	}
	return total
}
