package main

import (
	"bytes"
	"cmp"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

var (
	backendList = flag.String("backends", "", "drain, latency, lease: run each build once per lease backend, a comma list of backendSettings' names (redis, postgres, postgres-only, etcd); a backend the build refuses (outboxd config exits non-zero) or whose server is not installed is skipped with a line saying why")
	etcdBin     = flag.String("etcd-bin", "etcd", "backend etcd: the etcd server binary started privately (Debian's etcd-server installs it as etcd)")
	etcdAddr    = flag.String("etcd", "", "backend etcd: the endpoints of a running etcd; empty: start a private one with -etcd-bin")
	leaseTTL    = flag.Duration("lease-ttl", 5*time.Second, "lease: poller.lock_ttl of both relays (a crash takeover waits about this long)")
)

// backendSettings are the --set pairs that select each lease backend, one
// row per backend: a new backend or store is a row here. etcd's endpoints
// are added when its server is up (etcdEndpoints).
var backendSettings = []struct {
	name string
	sets []string
}{
	{"redis", []string{"lock.backend=redis"}},
	{"postgres", []string{"lock.backend=postgres"}},
	// Postgres alone: the idempotency claims and marks in Postgres too, no
	// Redis configured.
	{"postgres-only", []string{"lock.backend=postgres", "idempotency.store=postgres", "redis.addrs="}},
	{"etcd", []string{"lock.backend=etcd"}},
}

// buildSets are the settings of the build being run (build.sets), added by
// startDaemon to every relay it starts.
var buildSets []string

// use makes bin the build being run and returns its path.
func use(bin build) string {
	buildSets = bin.sets
	return bin.path
}

// withBackends returns each build once per -backends entry its binary
// accepts, labelled "label backend", or bins as they are without -backends.
func withBackends(bins []build) []build {
	if *backendList == "" {
		return bins
	}
	var out []build
	for _, name := range strings.Split(*backendList, ",") {
		name = strings.TrimSpace(name)
		i := slices.IndexFunc(backendSettings, func(b struct {
			name string
			sets []string
		}) bool {
			return b.name == name
		})
		if i < 0 {
			check(fmt.Errorf("-backends: unknown backend %q", name))
		}
		sets := backendSettings[i].sets
		if name == "etcd" {
			sets = append(slices.Clone(sets), "lock.etcd.endpoints=http://127.0.0.1:2379")
		}
		for _, b := range bins {
			if why := refused(b.path, sets); why != "" {
				fmt.Printf("backend %s skipped for %s: %s\n", name, b.label, why)
				continue
			}
			if name == "etcd" {
				ep, why := etcdEndpoints()
				if why != "" {
					fmt.Printf("backend etcd skipped: %s\n", why)
					continue
				}
				sets = append(slices.Clone(backendSettings[i].sets), "lock.etcd.endpoints="+ep)
			}
			out = append(out, build{label: b.label + " " + name, path: b.path, sets: sets})
		}
	}
	if len(out) == 0 {
		check(fmt.Errorf("-backends %s: no backend to run", *backendList))
	}
	return out
}

// refused is why bin's configuration check (outboxd config) refuses sets,
// or "" when it accepts them.
func refused(bin string, sets []string) string {
	args := []string{"config"}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return strings.TrimSpace(cmp.Or(stderr.String(), err.Error()))
	}
	return ""
}

var etcdStarted string

// etcdEndpoints returns -etcd, or starts a private etcd server (-etcd-bin)
// in a temporary folder, once, stopped at exit; why says why there is none.
func etcdEndpoints() (endpoints, why string) {
	if *etcdAddr != "" {
		return *etcdAddr, ""
	}
	if etcdStarted != "" {
		return etcdStarted, ""
	}
	bin, err := exec.LookPath(*etcdBin)
	if err != nil {
		return "", fmt.Sprintf("no etcd server (-etcd-bin %s: %v; Debian: apt-get install etcd-server) and no -etcd", *etcdBin, err)
	}
	dir, err := os.MkdirTemp("", "outboxd-bench-etcd")
	check(err)
	client, peer := "http://"+freePort(), "http://"+freePort()
	cmd := exec.Command(bin, "--data-dir", filepath.Join(dir, "data"), "--name", "bench",
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer, "--initial-cluster", "bench="+peer)
	var logs tail
	cmd.Stdout, cmd.Stderr = &logs, &logs
	check(cmd.Start())
	atExit(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = os.RemoveAll(dir)
	})
	for i := 0; ; i++ {
		if i == 200 {
			return "", fmt.Sprintf("etcd did not answer at %s within 10 s:\n%s", client, logs.String())
		}
		if out, err := exec.Command("curl", "-sf", client+"/health").Output(); err == nil && bytes.Contains(out, []byte("true")) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	etcdStarted = client
	return client, ""
}

// ---- lease: handover and takeover ----

// leaseRounds measures, per build (and backend), how long delivery stops
// when the leader hands over (SIGTERM: it finishes, releases, a standby
// takes the lock) and when it crashes (SIGKILL: the standby waits out the
// lease, -lease-ttl): from the signal to the delivery, by the standby,
// of an event committed just after it (its dispatched_at).
func leaseRounds(ctx context.Context, bins []build) {
	type key struct{ label, what string }
	res := map[key][]float64{}
	for r := range *runs {
		for _, bin := range bins {
			for _, what := range []string{"graceful handover", "crash takeover"} {
				ms, ok := leaseOnce(ctx, bin, what == "crash takeover")
				word := ""
				if !ok {
					word = " (the event was delivered by the old leader: not a handover, left out)"
				} else {
					res[key{bin.label, what}] = append(res[key{bin.label, what}], ms)
				}
				fmt.Printf("run %d %s %s: %.1f ms from the signal to the standby's delivery%s (load %s)\n", r+1, bin.label, what, ms, word, loadAvg())
			}
		}
	}
	fmt.Printf("\n| build | graceful handover ms (SIGTERM) min / median / max | crash takeover ms (SIGKILL, poller.lock_ttl %v) min / median / max |\n|---|---|---|\n", *leaseTTL)
	for _, bin := range bins {
		col := func(what string) string {
			if xs := res[key{bin.label, what}]; len(xs) > 0 {
				return mmmMs(xs)
			}
			return "not measured"
		}
		fmt.Printf("| %s | %s | %s |\n", bin.label, col("graceful handover"), col("crash takeover"))
	}
}

func mmmMs(xs []float64) string {
	return fmt.Sprintf("%.1f / %.1f / %.1f", slices.Min(xs), median(xs), slices.Max(xs))
}

// leaseOnce starts a leader and a standby on a fresh database, signals the
// leader, commits one event and returns the time from the signal to that
// event's mark; ok is false when the old leader delivered it.
func leaseOnce(ctx context.Context, bin build, crash bool) (ms float64, ok bool) {
	r := newRun(ctx, use(bin))
	defer r.done()
	pool, err := pgxpool.New(ctx, r.dsn)
	check(err)
	defer pool.Close()
	ttl := []string{"dispatch.sink=noop", "poller.lock_ttl=" + leaseTTL.String()}
	leader := startDaemon(ctx, bin.path, r.dsn, r.prefix, *latBatch, false, ttl)
	defer leader.stop()
	leader.waitLeader()
	standby := startDaemon(ctx, bin.path, r.dsn, r.prefix, *latBatch, false, ttl)
	defer standby.stop()
	time.Sleep(time.Second) // the standby is waiting for the lock
	sig := syscall.SIGTERM
	if crash {
		sig = syscall.SIGKILL
	}
	signalled := time.Now()
	check(leader.cmd.Process.Signal(sig))
	insertBacklog(ctx, pool, 1)
	var at time.Time
	for {
		err := pool.QueryRow(ctx, `SELECT dispatched_at FROM outbox WHERE dispatched_at IS NOT NULL`).Scan(&at)
		if err == nil {
			break
		}
		standby.checkAlive()
		if time.Since(signalled) > *leaseTTL+30*time.Second {
			check(fmt.Errorf("lease %s: nothing delivered %v after the signal", bin.label, time.Since(signalled)))
		}
		time.Sleep(2 * time.Millisecond)
	}
	return float64(at.Sub(signalled).Microseconds()) / 1000, standby.dispatched() >= 1
}
