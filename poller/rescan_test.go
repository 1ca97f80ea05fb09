package poller

import (
	"context"
	"math"
	"testing"
	"time"
)

// A rescan step runs in the read loop, so it is paced by its own cost,
// idle reads or not: after a step that took d, the next starts no sooner
// than stepSpacing × d later. Steps used to run back to back on every idle
// read; under a held snapshot a pass over 1.2M ids then stalled the reads
// for about a second every rescanEvery (the p99 spikes in minutes 5 and 10
// of a 10-minute run). Counted in steps, not in a window of time: under
// load one step took over 15 ms, and 20× that left a 300 ms window one step
// (a CI-like run failed: "1 rescan steps in 300 ms of idle reads").
func TestRescanStepsArePacedByTheirCost(t *testing.T) {
	e := newEnv(t)
	e.insert(2000, 10)
	p := e.poller(testConfig(), "")
	r := &reader{rescan: rescanPacer{to: 1 << 40, at: time.Now()}, cur: readCursor{inflightLow: math.MaxInt64}, parked: parkedSet{}}
	ctx := context.Background()
	const want = 4 // three spacings checked
	steps := 0
	// The limit only ends a test whose steps never come again.
	for limit := time.Now().Add(time.Minute); steps < want; {
		if time.Now().After(limit) {
			t.Fatalf("%d rescan steps in 1m of idle reads, want %d", steps, want)
		}
		lo, prevAt, prevTook := r.rescan.lo, r.rescan.stepAt, r.rescan.last
		if err := p.maintain(ctx, r, true, 0); err != nil {
			t.Fatal(err)
		}
		if r.rescan.lo == lo {
			continue
		}
		steps++
		if began := r.rescan.stepAt.Add(-r.rescan.last); !prevAt.IsZero() && began.Sub(prevAt) < stepSpacing*prevTook {
			t.Fatalf("rescan step %d began %v after the last one ended, which took %v: want at least %d× that", steps, began.Sub(prevAt), prevTook, stepSpacing)
		}
	}
}

// One slow step (Postgres stalled, a lock wait) puts the next off by at
// most maxStepPause, not stepSpacing times its duration: a step that took
// an hour would otherwise stop the rescan for 20 hours.
func TestRescanPauseAfterASlowStepIsCapped(t *testing.T) {
	e := newEnv(t)
	e.insert(100, 10)
	p := e.poller(testConfig(), "")
	now := time.Now()
	r := &reader{cur: readCursor{inflightLow: math.MaxInt64}, parked: parkedSet{},
		rescan: rescanPacer{to: 1 << 20, at: now, span: rescanMin, last: time.Hour, stepAt: now.Add(-maxStepPause - time.Second)}}
	if err := p.maintain(context.Background(), r, true, 0); err != nil {
		t.Fatal(err)
	}
	if r.rescan.lo == 0 {
		t.Fatalf("no rescan step %v after one that took %v: want the pause capped at %v", time.Since(r.rescan.stepAt), time.Hour, maxStepPause)
	}
}
