package poller

import (
	"slices"
	"testing"
	"time"

	"github.com/outboxd/outboxd/store"
)

// merge must keep a run still holding apart from an adjacent run given up:
// joined, the holding ids would be given up with the other run (rows above
// them sent while their transaction may still commit), or the given-up ids
// held again. Such neighbours arise across a read's span bound; the
// end-to-end case needs over 10,000 gaps and a read timed between the two
// give-ups, so the rule is checked here, on what the next read holds.
func TestMergeKeepsAHoldingRunApartFromAGivenUpOne(t *testing.T) {
	now := time.Now()
	for _, holdingBelow := range []bool{true, false} {
		holding := gapState{horizon: 7, seen: now}
		givenUp := gapState{horizon: 5, seen: now.Add(-time.Minute), givenUp: true}
		lower, upper := holding, givenUp
		if !holdingBelow {
			lower, upper = givenUp, holding
		}
		w := &gapWatch{runs: gapSet{{lo: 10, hi: 19, gapState: lower}, {lo: 20, hi: 29, gapState: upper}}}
		w.runs.merge()
		var pos store.ReadPos
		w.watch(&pos, now, time.Second)
		var held []int64
		for _, g := range pos.Holding {
			held = append(held, g.ID)
		}
		want := idRange(10, 19)
		if !holdingBelow {
			want = idRange(20, 29)
		}
		if !slices.Equal(held, want) {
			where := "above"
			if holdingBelow {
				where = "below"
			}
			t.Errorf("a holding run %s a given-up one: after merge the read holds ids %v, want %v (%d runs)", where, held, want, len(w.runs))
		}
	}

	// Two adjacent runs holding are one run, held as long as either would be.
	s := gapSet{
		{lo: 10, hi: 19, gapState: gapState{horizon: 7, seen: now.Add(-time.Second)}},
		{lo: 20, hi: 29, gapState: gapState{horizon: 9, seen: now}},
	}
	s.merge()
	if len(s) != 1 || s[0].lo != 10 || s[0].hi != 29 || s[0].horizon != 9 || !s[0].seen.Equal(now) {
		t.Fatalf("two adjacent holding runs after merge: %+v, want one run 10-29 with horizon 9 and the later first-missed time", s)
	}
}

func idRange(lo, hi int64) []int64 {
	var out []int64
	for id := lo; id <= hi; id++ {
		out = append(out, id)
	}
	return out
}
