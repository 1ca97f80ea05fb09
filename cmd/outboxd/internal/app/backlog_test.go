package app

import (
	"context"
	"testing"
	"time"
)

// TestSlowBacklogCountsAreSpacedOut: a count that took longer than
// slowBacklogCount is not repeated before backlogSpacing times its
// duration; a quick one runs at every scrape.
func TestSlowBacklogCountsAreSpacedOut(t *testing.T) {
	var g backlogGate
	clock := time.Unix(1_000_000, 0)
	now := func() time.Time { return clock }
	counts := 0
	scrape := func(took time.Duration) {
		g.run(context.Background(), now, func(context.Context) { counts++; clock = clock.Add(took) })
	}
	for range 5 { // quick counts: every scrape counts
		scrape(10 * time.Millisecond)
		clock = clock.Add(time.Millisecond)
	}
	if counts != 5 {
		t.Fatalf("%d quick counts in 5 scrapes, want 5", counts)
	}
	scrape(200 * time.Millisecond) // a slow one: none for 4 s from its start
	for range 10 {
		clock = clock.Add(250 * time.Millisecond)
		scrape(200 * time.Millisecond)
	}
	// Scrapes at +0.45 … +2.7 s see the last values.
	if counts != 6 {
		t.Fatalf("%d counts, want 6: a slow count was repeated within 20× its duration", counts)
	}
	for range 6 { // up to +4.2 s: the last one counts
		clock = clock.Add(250 * time.Millisecond)
		scrape(time.Millisecond)
	}
	if counts != 7 {
		t.Fatalf("%d counts, want 7: the count after 20× the slow one's duration did not run", counts)
	}
}
