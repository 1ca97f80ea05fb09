package poller

import (
	"context"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/keys"
	"github.com/outboxd/outboxd/store"
)

// Whose claim a batch takes over at once (claimValue.supersedes): an
// earlier term's (lower token), or an earlier batch of its own term (same
// token and owner). Not a newer term's, and not one of the same token from
// another owner: two acquisitions can get one token after Redis lost its
// data (the counter is floored by the highest token Postgres accepted,
// which the first may not have written yet), and the other one may be
// sending that row now; it is left for the next batch (foreign).
func TestClaimsTakenOverByTokenAndOwner(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.insert(1, 1)
	r := e.poller(testConfig(), "")
	rows, err := e.st.FetchDue(ctx, store.FetchLimits{Rows: 10})
	if err != nil || len(rows) != 1 {
		t.Fatalf("%d rows, %v", len(rows), err)
	}
	ours := claimValue{token: 7, owner: "ours", batch: "b2"}
	key := keys.New(e.prefix).Idempotency(rows[0].ID)
	for _, tc := range []struct {
		found claimValue
		want  outcome
	}{
		{claimValue{token: 6, owner: "other", batch: "b1"}, pending},
		{claimValue{token: 7, owner: "ours", batch: "b1"}, pending},
		{claimValue{token: 7, owner: "other", batch: "b1"}, foreign},
		{claimValue{token: 8, owner: "other", batch: "b1"}, foreign},
	} {
		if err := e.rdb.Set(ctx, key, tc.found.String(), time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		items := []item{{row: rows[0]}}
		if err := r.claimKeys(ctx, items, ours); err != nil {
			t.Fatal(err)
		}
		if items[0].outcome != tc.want {
			t.Errorf("our claim %s over %s: outcome %d, want %d", ours, tc.found, items[0].outcome, tc.want)
		}
		v, err := e.rdb.Get(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if want := map[outcome]string{pending: ours.String(), foreign: tc.found.String()}[tc.want]; v != want {
			t.Errorf("our claim %s over %s: the key holds %q, want %q", ours, tc.found, v, want)
		}
	}
}
