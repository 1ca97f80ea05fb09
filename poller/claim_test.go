package poller

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxd/outboxd/internal/keys"
)

// fingerprints reads each row's fingerprint as the poller computes it.
func (e *env) fingerprints() map[int64]struct {
	fp      string
	created time.Time
} {
	e.t.Helper()
	rows, _ := e.st.Pool().Query(context.Background(),
		`SELECT id, created_at, aggregate_type, aggregate_id, event_type FROM outbox ORDER BY id`)
	out := map[int64]struct {
		fp      string
		created time.Time
	}{}
	var id int64
	var at time.Time
	var t, a, ev string
	if _, err := pgx.ForEachRow(rows, []any{&id, &at, &t, &a, &ev}, func() error {
		out[id] = struct {
			fp      string
			created time.Time
		}{keys.Fingerprint(at, t, a, ev), at}
		return nil
	}); err != nil {
		e.t.Fatal(err)
	}
	return out
}

// A delivered mark names its row: this row's mark is a duplicate (marked,
// not sent); a mark of an earlier row with the same id (ids reused) is
// overwritten and the row sent; a bare "1" of earlier versions is trusted
// only if it was written after the row was created (the upgrade window).
func TestDeliveredMarkNamesItsRow(t *testing.T) {
	e := newEnv(t)
	ids := e.insert(12, 12) // one row per aggregate: no row waits behind another
	fps := e.fingerprints()
	ctx := context.Background()
	key := func(id int64) string { return keys.New(e.prefix).Idempotency(id) }
	set := func(id int64, v string, ttl time.Duration) {
		if err := e.rdb.Set(ctx, key(id), v, ttl).Err(); err != nil {
			t.Fatal(err)
		}
	}
	earlier := fps[ids[0]].created.Add(-time.Minute)
	age := time.Since(fps[ids[0]].created) // how long ago the rows were created
	foreign := keys.Delivered(keys.Fingerprint(earlier, "deal", "0", "deal.funded"))
	set(ids[0], foreign, keys.DeliveredTTL)                                                              // an earlier row's mark
	set(ids[1], keys.Delivered(fps[ids[1]].fp), keys.DeliveredTTL)                                       // this row's mark
	set(ids[2], "1", keys.DeliveredTTL)                                                                  // legacy, written just now
	set(ids[3], "1", keys.DeliveredTTL-age-keys.LegacySkew-time.Minute)                                  // legacy, written before the row
	set(ids[4], "1", 0)                                                                                  // legacy without a TTL: not ours
	set(ids[5], keys.Delivered(keys.Fingerprint(fps[ids[5]].created, "x", "y", "z")), keys.DeliveredTTL) // same time, other row

	r := e.poller(testConfig(), "")
	e.run(r)
	e.waitAllDispatched(20 * time.Second)

	ok := e.rc.OKCounts()
	for _, i := range []int{0, 3, 4, 5} {
		if ok[ids[i]] != 1 {
			t.Errorf("row %d (key of another row) sent %d times, want once", ids[i], ok[ids[i]])
		}
		if v, _ := e.rdb.Get(ctx, key(ids[i])).Result(); v != keys.Delivered(fps[ids[i]].fp) {
			t.Errorf("row %d's key is %q after delivery, want its own mark %q", ids[i], v, keys.Delivered(fps[ids[i]].fp))
		}
	}
	for _, i := range []int{1, 2} {
		if ok[ids[i]] != 0 {
			t.Errorf("row %d (its own mark) sent %d times, want a duplicate: marked, not sent", ids[i], ok[ids[i]])
		}
	}
	for _, id := range ids[6:] {
		if ok[id] != 1 {
			t.Errorf("row %d sent %d times, want once", id, ok[id])
		}
	}
	if got := testutil.ToFloat64(r.m.IdempotencyForeign); got != 4 {
		t.Errorf("outboxd_idempotency_foreign_total = %v, want 4", got)
	}
	if got := testutil.ToFloat64(r.m.Duplicates); got != 2 {
		t.Errorf("outboxd_already_delivered_total = %v, want 2", got)
	}
	if got := testutil.ToFloat64(r.m.ClaimsTakenOver); got != 0 {
		t.Errorf("outboxd_claims_taken_over_total = %v, want 0 (marks are not claims)", got)
	}
}

// takeover.lua compares exact values, and its "delivered" answer means
// this row's mark, never any mark.
func TestTakeoverComparesExactValues(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	k := e.prefix + "idempotency:notify:1"
	ours, seen := "claim:9:me:b", "claim:3:them:a"
	mine := keys.Delivered("abc.00000001")
	for _, c := range []struct {
		holds string
		want  int64
		after string
	}{
		{seen, 1, ours},                         // unchanged: taken over
		{"1:abc.00000002", 0, "1:abc.00000002"}, // another row's mark appeared: not "delivered" for us, left alone
		{"1", 0, "1"},                           // a bare mark appeared: judged again by the next claim
		{mine, 2, mine},                         // this row's mark: delivered
		{"claim:4:them:c", 0, "claim:4:them:c"}, // another claim
	} {
		if err := e.rdb.Set(ctx, k, c.holds, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		n, err := takeoverScript.Run(ctx, e.rdb, []string{k}, seen, ours, "60000", mine).Int64()
		if err != nil {
			t.Fatal(err)
		}
		if v, _ := e.rdb.Get(ctx, k).Result(); n != c.want || v != c.after {
			t.Errorf("key holding %q: takeover answered %d, key %q; want %d, %q", c.holds, n, v, c.want, c.after)
		}
	}
}

// claim.lua answers a bare "1" with its PTTL, other values as they are.
func TestClaimReportsLegacyMarkAge(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	k := func(i int) string { return e.prefix + "idempotency:notify:" + strconv.Itoa(i) }
	e.rdb.Set(ctx, k(1), "1", time.Hour)
	e.rdb.Set(ctx, k(2), "1:x.y", time.Hour)
	got, err := claimScript.Run(ctx, e.rdb, []string{k(1), k(2), k(3)}, "claim:1:o:b", "60000").Slice()
	if err != nil {
		t.Fatal(err)
	}
	v, pttl, err := claimReply(got[0])
	if err != nil || v != "1" || pttl <= 59*time.Minute || pttl > time.Hour {
		t.Errorf("bare 1: %q, %s, %v; want \"1\" with ~1h", v, pttl, err)
	}
	if v, _, err := claimReply(got[1]); err != nil || v != "1:x.y" {
		t.Errorf("mark: %q, %v", v, err)
	}
	if _, _, err := claimReply(got[2]); err == nil {
		t.Errorf("absent key: want redis.Nil (ours), got nil error")
	}
}
