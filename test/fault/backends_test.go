package fault

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/outboxd/outboxd/internal/testkit"
)

// backend is one lock.backend the cases of this file run against: one row
// of backends. A new backend is a new row.
type backend struct {
	name     string
	settings []string // OUTBOXD_* settings every replica gets
	// start starts the backend's own service for c, if it has one, and
	// returns the settings that point the replicas at it; nil for none.
	start func(c *cluster) []string
	// holder is the instance_id the backend records as lock's holder,
	// read from the backend itself ("" when nobody holds it).
	holder func(c *cluster, lock string) (string, error)
	// restarts restart the backend's own service mid-run. Postgres'
	// crash-restart comes on top for every backend: it holds the fence.
	restarts []fault
	// chaos are more faults of the backend's service for the chaos run.
	chaos []fault
	// program is what start runs: without it on PATH the row is
	// skipped, except in CI, where it fails. "" for none.
	program string
}

// fault is one named injection into a running cluster.
type fault struct {
	name string
	do   func(c *cluster)
	// start, if set, starts the backend's service as this fault needs it
	// (e.g. more members), instead of the backend's start.
	start func(c *cluster) []string
}

// withStart is b started as the first of fs with a start of its own says,
// if any: so the chaos run's service takes every fault of the backend.
func withStart(b backend, fs ...fault) backend {
	for _, f := range fs {
		if f.start != nil {
			b.start = f.start
			break
		}
	}
	return b
}

var backends = []backend{
	{
		name:     "redis",
		holder:   redisHolder,
		restarts: []fault{{name: "redis-restart", do: func(c *cluster) { c.redis.Restart() }}},
		chaos: []fault{{name: "redis-flushall", do: func(c *cluster) {
			_ = c.redis.Client().FlushAll(context.Background()).Err()
		}}},
	},
	{
		name:     "postgres",
		settings: []string{"OUTBOXD_LOCK_BACKEND=postgres"},
		holder:   postgresHolder,
	},
	{
		name:     "etcd",
		settings: etcdSettings,
		start:    etcdStart(1),
		holder:   etcdHolder,
		restarts: []fault{etcdRestart, etcdMemberLoss},
		chaos:    []fault{etcdCrash},
		program:  etcdBinary,
	},
}

// pgCrashRestart crash-restarts the cluster's own Postgres (ownPostgres):
// the fence for every backend, and the Postgres lease's table.
var pgCrashRestart = fault{name: "postgres-crash-restart", do: func(c *cluster) { c.pg.CrashRestart() }}

const pollerLock = "lock:outbox:poller"

// redisHolder reads the Redis lease's holder record of lock, if its owner
// still holds the lock key.
func redisHolder(c *cluster, lock string) (string, error) {
	ctx := context.Background()
	rdb := c.redis.Client()
	owner, err := rdb.Get(ctx, lock).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	rec, err := rdb.HGetAll(ctx, "holder:{"+lock+"}").Result()
	if err != nil || rec["owner"] != owner {
		return "", err
	}
	return rec["instance"], nil
}

// postgresHolder reads the Postgres lease's row of lock, if it has not
// expired on Postgres' clock.
func postgresHolder(c *cluster, lock string) (string, error) {
	var instance string
	err := c.st.Pool().QueryRow(context.Background(),
		`SELECT instance FROM outbox_leases WHERE lock_name = $1 AND owner IS NOT NULL AND expires_at > now()`, lock).Scan(&instance)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	return instance, err
}

// eachBackend runs f as a subtest per backend, in parallel unless serial.
func eachBackend(t *testing.T, serial bool, f func(t *testing.T, b backend)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			needProgram(t, b)
			if !serial {
				t.Parallel()
			}
			f(t, b)
		})
	}
}

// needProgram skips b's cases when the program its service runs is not
// installed, and fails them in CI, which installs it.
func needProgram(t *testing.T, b backend) {
	t.Helper()
	if b.program == "" {
		return
	}
	if _, err := exec.LookPath(b.program); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s: %s is not on PATH, and CI installs it (scripts/services.sh): %v", b.name, b.program, err)
		}
		t.Skipf("%s: %s is not on PATH: run scripts/services.sh to install it", b.name, b.program)
	}
}

// record logs a figure of a backend and appends it to the file
// OUTBOXD_TEST_FAULT_REPORT names, for BENCHMARKS.md.
func record(t *testing.T, b backend, name string, d time.Duration) {
	t.Helper()
	t.Logf("%s %s: %s", b.name, name, d.Round(time.Millisecond))
	if f := os.Getenv("OUTBOXD_TEST_FAULT_REPORT"); f != "" {
		appendReport(f, fmt.Sprintf("%s_ms %d backend %s\n", name, d.Milliseconds(), b.name))
	}
}

func appendReport(file, line string) {
	af, err := os.OpenFile(filepath.Clean(file), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err == nil {
		_, _ = af.WriteString(line)
		_ = af.Close()
	}
}

// newestToken is the highest fencing token any request carried so far.
func (c *cluster) newestToken() int64 {
	var top int64
	for _, r := range c.rc.Requests() {
		top = max(top, r.Token)
	}
	return top
}

// flowsAgain waits until a delivery carrying a token above old arrives
// after since, and returns how long after since it arrived.
func (c *cluster) flowsAgain(since time.Time, old int64, limit time.Duration) time.Duration {
	c.t.Helper()
	var at time.Time
	c.rc.Wait(c.t, limit, fmt.Sprintf("a delivery with a token above %d", old), func(reqs []testkit.Request) bool {
		for _, r := range reqs {
			if r.OK() && r.Token > old && r.At.After(since) {
				at = r.At
				return true
			}
		}
		return false
	})
	return at.Sub(since)
}

// kill -9 of the leader with a batch in flight (its send held at the
// receiver): a standby takes the lease once it expires in the backend,
// resends what the dead leader sent unmarked, and the cluster flows again;
// nothing lost, order kept, the fence only rises (check). The time from
// the kill to the first delivery of the new leader is a figure, not a
// threshold (the race-built binary on a shared machine).
func TestKillLeaderMidBatch(t *testing.T) {
	t.Parallel()
	eachBackend(t, false, func(t *testing.T, b backend) {
		var flow time.Duration
		rep := runCaseWith(t, options{backend: b, named: true}, func(c *cluster) {
			l := c.leader()
			release := c.hold("deal/3") // a batch is in flight when the leader dies
			c.waitHeld()
			old := c.newestToken()
			killAt := time.Now()
			c.signal(l, syscall.SIGKILL)
			<-c.reps[l].Done()
			release() // its held send now "succeeds" at the receiver: the successor must resend
			flow = c.flowsAgain(killAt, old, 60*time.Second)
		}, nil)
		record(t, b, "kill9_time_to_flow_race", flow)
		if rep.tokens < 2 {
			t.Fatal("no takeover after the leader was killed")
		}
		if rep.duplicates == 0 {
			t.Fatal("no duplicate: the kill did not hit a batch between send and mark")
		}
	})
}

// SIGSTOP of the leader with a batch in flight, past its lease: another
// replica takes over; SIGCONT: the resumed replica finds its lease gone,
// says so ("lock lost", or "fence rejected" when it still had a write to
// make), and steps down. No stale write: tokens never go back at the
// receiver after the pause, the fence only rises (check).
func TestPausedLeaderResumes(t *testing.T) {
	t.Parallel()
	eachBackend(t, false, func(t *testing.T, b backend) {
		var paused int
		c, rep := runCluster(t, options{backend: b, named: true}, (*cluster).produce, func(c *cluster) {
			l := c.leader()
			paused = l
			release := c.hold("deal/3")
			c.waitHeld()
			c.signal(l, syscall.SIGSTOP)
			release()
			c.leaderOtherThan(l) // paused past its lease: another replica took over
			if n := c.leader(); n == l {
				t.Fatal("the paused leader still reported leading")
			}
			c.signal(l, syscall.SIGCONT)
			c.waitStandby(l) // it resumed, found its lease gone, tried to write, stepped down
		}, nil)
		logs := c.reps[paused].logs()
		lost, rejected := strings.Count(logs, `"msg":"lock lost"`), strings.Count(logs, `"msg":"fence rejected"`)
		if lost+rejected == 0 {
			t.Errorf("the resumed replica logged neither \"lock lost\" nor \"fence rejected\":\n%s", tail(logs, 20))
		}
		t.Logf("resumed replica: %d lock lost, %d fence rejected; fence rejections in all: %d", lost, rejected, rep.fenceRejected)
	})
}

// A SIGTERM hands the lease over: the standby leads within milliseconds of
// the release, the backend names it as the holder (its instance_id), so
// does /status, and nothing is lost. The time from the SIGTERM to the new
// leader's first delivery is a figure.
func TestGracefulHandover(t *testing.T) {
	t.Parallel()
	eachBackend(t, false, func(t *testing.T, b backend) {
		c := newCluster(t, options{backend: b, named: true})
		c.startAll(2)
		l := c.leader()
		c.waitStandby(1 - l)
		if got := c.statusHolder(1 - l); got != instanceID(l) {
			t.Fatalf("standby's /status names holder %q, want %q", got, instanceID(l))
		}
		if got, err := b.holder(c, pollerLock); err != nil || got != instanceID(l) {
			t.Fatalf("the %s backend names holder %q (%v), want %q", b.name, got, err, instanceID(l))
		}
		started := time.Now()
		c.produce()
		c.waitFlowing(started, flowing, 30*time.Second)
		old := c.newestToken()
		handoverAt := time.Now()
		c.signal(l, syscall.SIGTERM)
		handover := c.flowsAgain(handoverAt, old, 30*time.Second)
		<-c.reps[l].Done()
		if n := c.leaderOtherThan(l); n != 1-l {
			t.Fatalf("replica %d leads, want %d", n, 1-l)
		}
		record(t, b, "graceful_handover_race", handover)
		c.waitFlowing(time.Now(), flowing, 60*time.Second)
		if got := c.statusHolder(1 - l); got != instanceID(1-l) {
			t.Fatalf("after the handover /status names holder %q, want %q", got, instanceID(1-l))
		}
		if got, err := b.holder(c, pollerLock); err != nil || got != instanceID(1-l) {
			t.Fatalf("after the handover the %s backend names holder %q (%v), want %q", b.name, got, err, instanceID(1-l))
		}
		if !strings.Contains(c.reps[l].logs(), `"lock released"`) {
			t.Fatalf("the stopped leader did not release its lease:\n%s", tail(c.reps[l].logs(), 20))
		}
		c.stopProducing()
		c.drain(60 * time.Second)
		c.stopAll()
		c.check(handoverAt, nil)
	})
}

// The services behind the lease and the fence restarted mid-run: Postgres
// crash-restarted (the fence for every backend; the Postgres lease's table
// too), and each backend's own service restarted. The replicas wait and
// retry, never crash, and deliver everything in order.
func TestBackendRestart(t *testing.T) {
	t.Parallel()
	eachBackend(t, false, func(t *testing.T, b backend) {
		for _, f := range append([]fault{pgCrashRestart}, b.restarts...) {
			t.Run(f.name, func(t *testing.T) {
				t.Parallel()
				runCaseWith(t, options{backend: withStart(b, f), named: true, ownPostgres: f.name == pgCrashRestart.name}, f.do, nil)
			})
		}
	})
}

// produceRacing runs three producers at once over the same eight
// aggregates, each holding its transaction open a moment after its insert,
// so ids commit out of order across producers, until stopProducing.
func (c *cluster) produceRacing() {
	ctx, cancel := context.WithCancel(context.Background())
	c.prodStop, c.prodDone = cancel, make(chan struct{})
	var wg sync.WaitGroup
	for p := range 3 {
		wg.Go(func() { c.raceProducer(ctx, p) })
	}
	go func() {
		wg.Wait()
		close(c.prodDone)
	}()
}

func (c *cluster) raceProducer(ctx context.Context, p int) {
	pool := c.st.Pool()
	for n := 0; ctx.Err() == nil; n++ {
		var ids []int64
		began := time.Now()
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
				SELECT 'deal', ((@n::int + g) % 8)::text, 'deal.funded', jsonb_build_object('producer', @p::int, 'n', @n::int)
				FROM generate_series(1, 1 + @n::int % 3) g RETURNING id`, pgx.NamedArgs{"n": n, "p": p})
			if err != nil {
				return err
			}
			if ids, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
				return err
			}
			time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond) // another producer commits meanwhile
			return nil
		})
		if err == nil {
			c.prodMu.Lock()
			c.committed = append(c.committed, ids...)
			c.longestTx = max(c.longestTx, time.Since(began))
			c.prodMu.Unlock()
		}
	}
}

// Three producers race over the same aggregates while the leader is
// killed: every event is delivered and each aggregate's events arrive in
// id order, though their transactions commit out of id order (check).
// poller.gap_wait is 2 s here, so a producer goroutine starved on a loaded
// machine still commits within it.
func TestRacingProducers(t *testing.T) {
	t.Parallel()
	eachBackend(t, false, func(t *testing.T, b backend) {
		opt := options{backend: b, named: true, env: []string{"OUTBOXD_POLLER_GAP_WAIT=2s"}}
		c, _ := runCluster(t, opt, (*cluster).produceRacing, func(c *cluster) {
			l := c.leader()
			c.signal(l, syscall.SIGKILL)
			<-c.reps[l].Done()
			c.leaderOtherThan(l)
		}, nil)
		late := 0
		for _, r := range append(c.reps, c.ended...) {
			late += strings.Count(r.logs(), `"msg":"late commit"`)
		}
		t.Logf("late commits warned: %d; longest producer transaction %s", late, c.longestTx.Round(time.Millisecond))
	})
}

// reconciled is one "reconcile finished" line: a fire time run to its end.
type reconciled struct {
	fire    time.Time
	replica int
}

// reconciledRuns reads every replica's "reconcile finished" lines, those
// of replicas ended since included.
func (c *cluster) reconciledRuns() []reconciled {
	c.t.Helper()
	var out []reconciled
	for _, r := range append(c.reps, c.ended...) {
		for _, line := range r.out.Lines() {
			if !strings.Contains(line, `"msg":"reconcile finished"`) {
				continue
			}
			var v struct {
				Fire time.Time `json:"fire_time"`
			}
			if err := json.Unmarshal([]byte(line), &v); err != nil {
				c.t.Fatalf("replica %d: %v in %s", r.i, err, line)
			}
			out = append(out, reconciled{v.Fire, r.i})
		}
	}
	return out
}

// waitReconciled waits until n fire times after since have been reconciled
// by replicas other than not, and returns the latest run.
func (c *cluster) waitReconciled(since time.Time, n, not int) reconciled {
	c.t.Helper()
	var last reconciled
	testkit.WaitFor(c.t, 30*time.Second, fmt.Sprintf("%d fire times reconciled after %s", n, since.Format(time.TimeOnly)), func() bool {
		got := 0
		for _, r := range c.reconciledRuns() {
			if r.fire.After(since) && r.replica != not {
				got++
				if r.fire.After(last.fire) {
					last = r
				}
			}
		}
		return got >= n
	}, c.describe)
	return last
}

// Reconciliation fires every second on every replica; each fire time is
// run to its end by one replica only, also across a kill -9 of the replica
// that ran the last one, and each is recorded once in reconcile_runs.
func TestReconcileOncePerFireTime(t *testing.T) {
	t.Parallel()
	eachBackend(t, false, func(t *testing.T, b backend) {
		opt := options{backend: b, named: true, env: []string{"OUTBOXD_RECONCILE_SCHEDULE=@every 1s"}}
		c, _ := runCluster(t, opt, (*cluster).produce, func(c *cluster) {
			last := c.waitReconciled(time.Time{}, 3, -1)
			c.signal(last.replica, syscall.SIGKILL)
			<-c.reps[last.replica].Done()
			c.waitReconciled(time.Now(), 3, last.replica)
		}, nil)
		runs := c.reconciledRuns()
		by := map[time.Time][]int{}
		for _, r := range runs {
			by[r.fire] = append(by[r.fire], r.replica)
		}
		for fire, reps := range by {
			if len(reps) > 1 {
				t.Errorf("fire time %s reconciled %d times, by replicas %v", fire.Format(time.RFC3339Nano), len(reps), reps)
			}
		}
		rows, err := c.st.Pool().Query(context.Background(), `SELECT fire_time FROM reconcile_runs WHERE finished_at IS NOT NULL`)
		if err != nil {
			t.Fatal(err)
		}
		recorded, err := pgx.CollectRows(rows, pgx.RowTo[time.Time])
		if err != nil {
			t.Fatal(err)
		}
		for fire := range by {
			if !slices.ContainsFunc(recorded, fire.Equal) {
				t.Errorf("fire time %s reconciled, not in reconcile_runs", fire.Format(time.RFC3339Nano))
			}
		}
		t.Logf("%d fire times reconciled, %d runs logged, %d recorded", len(by), len(runs), len(recorded))
	})
}

var soak = flag.Duration("soak", 0, "run TestChaos for this long per backend (e.g. -soak 30m); 0: 30s, 12s with -short")

// chaosLength is how long a chaos run injects faults.
func chaosLength() time.Duration {
	switch {
	case *soak > 0:
		return *soak
	case testing.Short():
		return 12 * time.Second
	}
	return 30 * time.Second
}

// chaosFaults are the faults of the chaos run on b: the replicas', the
// receiver's, Postgres' and b's own service's.
func chaosFaults(b backend) []fault {
	fs := []fault{
		{name: "kill -9 leader", do: func(c *cluster) {
			l := c.leader()
			c.signal(l, syscall.SIGKILL)
			<-c.reps[l].Done()
			c.start(l)
		}},
		{name: "SIGSTOP leader 2xTTL", do: func(c *cluster) {
			l := c.leader()
			c.signal(l, syscall.SIGSTOP)
			time.Sleep(2 * c.pollerTTL())
			c.signal(l, syscall.SIGCONT)
		}},
		{name: "SIGTERM + restart one", do: func(c *cluster) {
			i := rand.IntN(len(c.reps))
			c.signal(i, syscall.SIGTERM)
			<-c.reps[i].Done()
			c.start(i)
			c.waitReady(i) // up again, its signals caught, before the next fault
		}},
		{name: "receiver 503 3s", do: func(c *cluster) {
			c.rc.SetRespond(func(testkit.Request) testkit.Reply { return testkit.Reply{Status: http.StatusServiceUnavailable} })
			time.Sleep(3 * time.Second)
			c.rc.SetRespond(nil)
		}},
		pgCrashRestart,
	}
	return slices.Concat(fs, b.restarts, b.chaos)
}

// A chaos run per backend: random faults (chaosFaults) for chaosLength
// (-soak for a long run) under a steady producer, then every invariant
// once: nothing lost, order kept, the fence only rises. Prints the count
// of each fault and the outcome:
//
//	go test ./test/fault -run 'TestChaos/postgres' -soak 30m -timeout 0
func TestChaos(t *testing.T) {
	t.Parallel()
	eachBackend(t, false, func(t *testing.T, b backend) {
		faults := chaosFaults(b)
		c := newCluster(t, options{backend: withStart(b, faults...), named: true, ownPostgres: true})
		c.startAll(3)
		c.leader()
		c.produce()
		start := time.Now()
		counts := map[string]int{}
		for time.Since(start) < chaosLength() {
			f := faults[rand.IntN(len(faults))]
			f.do(c)
			counts[f.name]++
			time.Sleep(time.Duration(1000+rand.IntN(2000)) * time.Millisecond)
		}
		c.waitFlowing(time.Now(), flowing, 60*time.Second) // recovered from the last fault
		c.stopProducing()
		c.drain(2 * time.Minute)
		c.stopAll()
		rep := c.check(start, nil)

		var s strings.Builder
		fmt.Fprintf(&s, "chaos %s on %s\n%-24s %6s\n", chaosLength(), b.name, "fault", "count")
		names := make([]string, 0, len(counts))
		for n := range counts {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			fmt.Fprintf(&s, "%-24s %6d\n", n, counts[n])
		}
		fmt.Fprintf(&s, "%-24s %6d\n%-24s %6d\n%-24s %6d\n%-24s %6d\n%-24s %6d\n%-24s %6d\n",
			"events", rep.events, "delivered", rep.delivered, "lost", rep.events-rep.delivered-rep.dead,
			"duplicates", rep.duplicates, "leaders (tokens)", rep.tokens, "fence rejections", rep.fenceRejected)
		t.Log(s.String())
	})
}
