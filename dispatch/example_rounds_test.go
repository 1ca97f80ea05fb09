package dispatch_test

import (
	"fmt"

	"github.com/outboxd/outboxd/dispatch"
)

// A sink that sends calls carrying many aggregates goes round by round:
// each round holds the next event of every aggregate still going. Event 3
// fails, so aggregate a's event 5 is never given and stays NotAttempted.
func ExampleRounds_Next() {
	events := []dispatch.Event{
		{ID: 1, AggregateType: "deal", AggregateID: "a"},
		{ID: 2, AggregateType: "deal", AggregateID: "b"},
		{ID: 3, AggregateType: "deal", AggregateID: "a"},
		{ID: 4, AggregateType: "deal", AggregateID: "b"},
		{ID: 5, AggregateType: "deal", AggregateID: "a"},
	}
	r := dispatch.NewRounds(events)
	for round := r.Next(); len(round) > 0; round = r.Next() {
		fmt.Println("round:", round)
		for _, i := range round {
			res := dispatch.Result{Outcome: dispatch.Delivered}
			if events[i].ID == 3 {
				res = dispatch.Result{Outcome: dispatch.Retryable}
			}
			r.Set(i, res)
		}
	}
	for i, res := range r.Results() {
		fmt.Println(events[i].ID, res.Outcome)
	}
	// Output:
	// round: [0 1]
	// round: [2 3]
	// 1 delivered
	// 2 delivered
	// 3 retryable
	// 4 delivered
	// 5 not attempted
}
