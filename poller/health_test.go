package poller

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// A run of failed fetches makes FetchFailure report once it is longer than
// the lease, naming the latest error; one success clears it.
func TestFetchFailureAfterALeasePeriod(t *testing.T) {
	p := &Poller{cfg: Config{LockTTL: 30 * time.Second}.withDefaults()}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := p.FetchFailure(t0); err != nil {
		t.Fatalf("no fetch yet: %v", err)
	}
	p.health.note(errors.New("first"), t0)
	p.health.note(errors.New("canceling statement due to statement timeout"), t0.Add(20*time.Second))
	if err := p.FetchFailure(t0.Add(30 * time.Second)); err != nil {
		t.Fatalf("failing for one lease period only: %v", err)
	}
	err := p.FetchFailure(t0.Add(31 * time.Second))
	if err == nil || !strings.Contains(err.Error(), "statement timeout") || !strings.Contains(err.Error(), "31s") {
		t.Fatalf("failing for 31s: got %v, want the latest error and the duration", err)
	}
	p.health.note(nil, t0.Add(32*time.Second))
	p.health.note(errors.New("again"), t0.Add(33*time.Second))
	if err := p.FetchFailure(t0.Add(60 * time.Second)); err != nil {
		t.Fatalf("a success restarts the count: %v", err)
	}
}
