package httpapi

import (
	"testing"
	"time"
)

// A place that served a request of d owes a rest of d×(1/share − 1) and
// serves again once it owes at most restBurst; a refused request learns
// how long until it may.
func TestLimitKeepsEachPlaceToItsShare(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	l := newLimit(1, 0.1)
	l.now = func() time.Time { return now }
	place, _, ok := l.try()
	if !ok {
		t.Fatal("the first request refused")
	}
	if _, _, ok := l.try(); ok {
		t.Fatal("a second request admitted while the place is busy")
	}
	now = now.Add(300 * time.Millisecond)
	l.release(place, 300*time.Millisecond) // owes 2.7s
	for _, tc := range []struct {
		after time.Duration
		admit bool
	}{{0, false}, {1600 * time.Millisecond, false}, {1700 * time.Millisecond, true}} {
		at := now.Add(tc.after)
		l.now = func() time.Time { return at }
		p, wait, ok := l.try()
		if ok != tc.admit {
			t.Fatalf("%s after the release: admitted %t, want %t (wait %s)", tc.after, ok, tc.admit, wait)
		}
		if !ok && wait != 1700*time.Millisecond-tc.after {
			t.Errorf("%s after the release: wait %s, want %s", tc.after, wait, 1700*time.Millisecond-tc.after)
		}
		if ok {
			l.release(p, 0)
		}
	}
}

// Without a share, a place serves again as soon as it is released.
func TestLimitWithoutShareHasNoRest(t *testing.T) {
	t.Parallel()
	l := newLimit(1, 0)
	p, _, _ := l.try()
	l.release(p, time.Hour)
	if _, _, ok := l.try(); !ok {
		t.Fatal("a released place refused without a share")
	}
}

// An operator's few quick requests in a row are served at once: their
// owed rest stays within restBurst.
func TestLimitServesAFewQuickRequestsInARow(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	l := newLimit(1, 0.05)
	l.now = func() time.Time { return now }
	for i := range 3 {
		p, wait, ok := l.try()
		if !ok {
			t.Fatalf("request %d refused (wait %s)", i+1, wait)
		}
		now = now.Add(10 * time.Millisecond)
		l.release(p, 10*time.Millisecond) // owes 190ms more each
	}
}
