package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

var pauses = flag.String("pause", "", "latency: stop a process with SIGSTOP and go on with SIGCONT, WHAT@AT:FOR[,...] with WHAT postgres (the server's every process: a stall of the whole database, as a slow WAL flush makes) or relay, AT from the producers' start, e.g. postgres@40s:2s,relay@80s:2s; each pause's recovery is reported")

// pause is one -pause: what to stop, when (from the producers' start) and
// for how long.
type pause struct {
	what    string
	at, dur time.Duration
}

func parsePauses(s string) []pause {
	var out []pause
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		what, rest, ok1 := strings.Cut(p, "@")
		at, dur, ok2 := strings.Cut(rest, ":")
		a, err1 := time.ParseDuration(at)
		d, err2 := time.ParseDuration(dur)
		if !ok1 || !ok2 || err1 != nil || err2 != nil || (what != "postgres" && what != "relay") || d <= 0 {
			check(fmt.Errorf("-pause %q: want postgres@AT:FOR or relay@AT:FOR, e.g. postgres@40s:2s", p))
		}
		out = append(out, pause{what: what, at: a, dur: d})
	}
	return out
}

// pausePIDs are the processes -pause stops: the relay, or every process of
// the Postgres server the pool is on (its postmaster and the postmaster's
// children, read from the data directory's postmaster.pid: superuser).
func pausePIDs(ctx context.Context, pool *pgxpool.Pool, what string, relay int) []int {
	if what == "relay" {
		return []int{relay}
	}
	var dir string
	check(pool.QueryRow(ctx, `SHOW data_directory`).Scan(&dir))
	b, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	check(err)
	pm, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	check(err)
	pids := []int{pm}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, st := range stats {
		b, err := os.ReadFile(st)
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid ...: comm may hold spaces, so from the last ')'.
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(pm) {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(st)))
			pids = append(pids, pid)
		}
	}
	return pids
}

// runPauses stops and continues the processes at their times, in s from
// start; it returns when the last pause ended or ctx did. A stopped process
// is always continued, whatever ctx says.
func runPauses(ctx context.Context, pool *pgxpool.Pool, ps []pause, start time.Time, relay int) {
	for _, p := range ps {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(start.Add(p.at))):
		}
		pids := pausePIDs(ctx, pool, p.what, relay)
		resume := func() {
			for _, pid := range pids {
				_ = syscall.Kill(pid, syscall.SIGCONT)
			}
		}
		atExit(resume) // an interrupted or failed bench never leaves the server stopped
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGSTOP)
		}
		time.Sleep(p.dur)
		resume()
	}
}

// pauseRecovery is what one pause cost (commit times and latencies in s
// and ms from the producers' start): the events committed while it lasted
// and when the last of them was marked, counted from its end (the relay's
// catch-up after a relay pause; after a Postgres pause the producers'
// commits return only when it ends); then, of the events committed in the
// 5 s after it, how many took over 10 ms, when the last of those was
// committed, and the slowest (the catch-up's cost to the events behind it).
func pauseRecovery(p pause, at []float64, lat []float64) string {
	from, to := p.at.Seconds(), (p.at + p.dur).Seconds()
	var during, after, over int
	var caughtUp, lastOver, worst float64
	for i, t := range at {
		switch {
		case t >= from && t < to:
			during++
			caughtUp = max(caughtUp, t+lat[i]/1000-to)
		case t >= to && t < to+5:
			after++
			worst = max(worst, lat[i])
			if lat[i] > 10 {
				over++
				lastOver = max(lastOver, t-to)
			}
		}
	}
	return fmt.Sprintf("pause %s %v at %v: %d events committed while it lasted, the last of them marked %.0f ms after it ended; of the %d committed in the 5 s after it, %d took over 10 ms (the last committed %.0f ms after it ended), the slowest %.1f ms",
		p.what, p.dur, p.at, during, caughtUp*1000, after, over, lastOver*1000, worst)
}
