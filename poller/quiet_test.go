package poller

import (
	"testing"
	"time"
)

func TestQuietWaitKeepsAStreamsGapsShort(t *testing.T) {
	const ms = time.Millisecond
	poll := 20 * ms
	var q quietWait
	var got []time.Duration
	for range streamGrace + 6 {
		got = append(got, q.next(poll))
	}
	want := []time.Duration{ms, ms, ms, ms, 2 * ms, 4 * ms, 8 * ms, 16 * ms, poll, poll}
	if len(got) != len(want) {
		t.Fatalf("waits %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("waits after rows %v, want %v: a millisecond for the first %d empty fetches, then doubling up to poll_interval", got, want, streamGrace)
		}
	}
	q.rows()
	if d := q.next(poll); d != ms {
		t.Fatalf("first wait after rows %v, want 1ms", d)
	}
}

func TestLeadPausesAMillisecondInAStreamAndAtOnceOnAFullBatch(t *testing.T) {
	p := &Poller{cfg: Config{PollInterval: 100 * time.Millisecond}}
	var q quietWait
	for range streamGrace + 3 { // quiet for a while: the wait has grown
		p.pause(batchResult{}, nil, &q)
	}
	cases := []struct {
		name string
		res  batchResult
		want time.Duration
	}{
		{"rows fetched", batchResult{fetched: 3}, time.Millisecond},
		{"full batch", batchResult{fetched: 500, more: true}, 0},
		{"empty, just after rows", batchResult{}, time.Millisecond},
	}
	for _, c := range cases {
		if d := p.pause(c.res, nil, &q); d != c.want {
			t.Fatalf("%s: pause %v, want %v", c.name, d, c.want)
		}
	}
}
