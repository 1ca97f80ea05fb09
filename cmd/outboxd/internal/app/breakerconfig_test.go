package app_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/app"
	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/internal/metrics"
	"github.com/outboxd/outboxd/internal/testkit"
)

// dispatch.breaker.failures: 0 means "never opens": it decodes to 0 (unset
// is the default, 5), and the breaker the relay builds from it stays closed
// while many different aggregates fail one after another; the same sends
// open a breaker built from failures: 3, so the test can see one open.
func TestBreakerFailuresZeroNeverOpens(t *testing.T) {
	t.Parallel()
	unset, err := app.LoadConfig("", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := unset.Dispatch.Breaker.Failures; got != dispatch.DefaultBreakerFailures {
		t.Fatalf("dispatch.breaker.failures unset: %d, want the default %d", got, dispatch.DefaultBreakerFailures)
	}
	for _, tc := range []struct {
		failures string
		wantOpen bool
	}{{"0", false}, {"3", true}} {
		// A webhook to a port nothing listens on: every send is refused,
		// a failure of the destination itself.
		c, err := app.LoadConfig("", []string{"dispatch.sink=webhook", "dispatch.webhook.url=http://127.0.0.1:1/events",
			"dispatch.breaker.failures=" + tc.failures})
		if err != nil {
			t.Fatal(err)
		}
		if tc.failures == "0" && c.Dispatch.Breaker.Failures != 0 {
			t.Fatalf("dispatch.breaker.failures=0 decoded as %d, want 0 (never opens)", c.Dispatch.Breaker.Failures)
		}
		a := &app.App{Cfg: c, Log: testkit.Logger(t), Metrics: metrics.New()}
		sink, err := a.Sink()
		if err != nil {
			t.Fatal(err)
		}
		b, ok := sink.(*dispatch.Breaker)
		if !ok {
			app.CloseSink(sink)
			t.Fatalf("sink %T, want the webhook in its circuit breaker", sink)
		}
		batch := dispatch.Batch{Token: 1, Until: func() time.Time { return time.Now().Add(time.Minute) }}
		for i := range 4 * dispatch.DefaultBreakerFailures {
			batch.Events = append(batch.Events, dispatch.Event{ID: int64(i + 1), AggregateType: "deal", AggregateID: fmt.Sprint(i), Payload: []byte(`{}`)})
		}
		held := 0
		for _, r := range b.Send(context.Background(), batch) {
			if r.Outcome == dispatch.NotAttempted {
				held++
			}
		}
		app.CloseSink(sink)
		if b.State().Open != tc.wantOpen {
			t.Errorf("failures %s: open %v after %d aggregates failed (%d sends held), want open %v",
				tc.failures, b.State().Open, len(batch.Events), held, tc.wantOpen)
		}
	}
}
