package httpapi

import (
	"testing"
	"time"
)

// A place that served a request of d rests d×(1/share − 1) before it
// serves again, and a refused request learns how long until it may.
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
	now = now.Add(200 * time.Millisecond)
	l.release(place, 200*time.Millisecond)
	for _, tc := range []struct {
		after time.Duration
		admit bool
	}{{0, false}, {1700 * time.Millisecond, false}, {1800 * time.Millisecond, true}} {
		at := now.Add(tc.after)
		l.now = func() time.Time { return at }
		p, wait, ok := l.try()
		if ok != tc.admit {
			t.Fatalf("%s after the release: admitted %t, want %t (wait %s)", tc.after, ok, tc.admit, wait)
		}
		if !ok && wait != 1800*time.Millisecond-tc.after {
			t.Errorf("%s after the release: wait %s, want %s", tc.after, wait, 1800*time.Millisecond-tc.after)
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
