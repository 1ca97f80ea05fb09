package admin_test

import (
	"slices"
	"testing"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/admin"
	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/store"
)

// A resend to one destination keeps the kinds the routes send there, first
// match winning, what no route matches going to "default", in their order.
func TestKindsRoutedTo(t *testing.T) {
	routes, err := dispatch.NewRoutes([]string{"default", "a", "b"}, []dispatch.Route{
		{AggregateType: "alpha", EventType: "*.paid", To: "b"},
		{AggregateType: "alpha", To: "a"},
		{EventType: "beta.*", To: "b"},
	})
	if err != nil {
		t.Fatal(err)
	}
	kinds := []store.EventKind{
		{AggregateType: "alpha", EventType: "order.created"},
		{AggregateType: "alpha", EventType: "order.paid"},
		{AggregateType: "beta", EventType: "beta.x"},
		{AggregateType: "gamma", EventType: "g"},
		{AggregateType: "alpha", EventType: "z"},
	}
	for dest, want := range map[string][]store.EventKind{
		"a":       {kinds[0], kinds[4]},
		"b":       {kinds[1], kinds[2]},
		"default": {kinds[3]},
		"nope":    {},
	} {
		if got := admin.KindsRoutedTo(routes, kinds, dest); !slices.Equal(got, want) {
			t.Errorf("%s: got %v, want %v", dest, got, want)
		}
	}
}
