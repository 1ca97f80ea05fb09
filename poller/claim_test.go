package poller

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxd/outboxd/internal/keys"
	"github.com/outboxd/outboxd/store"
)

// fingerprints reads each row's fingerprint as the poller computes it.
func (e *testBundle) fingerprints() map[int64]struct {
	fp      string
	created time.Time
} {
	e.t.Helper()
	rows, _ := e.st.Pool().Query(context.Background(),
		`SELECT id, created_at, aggregate_type, aggregate_id, event_type, payload, headers FROM outbox ORDER BY id`)
	out := map[int64]struct {
		fp      string
		created time.Time
	}{}
	var id int64
	var at time.Time
	var t, a, ev string
	var payload, headers []byte
	if _, err := pgx.ForEachRow(rows, []any{&id, &at, &t, &a, &ev, &payload, &headers}, func() error {
		out[id] = struct {
			fp      string
			created time.Time
		}{keys.Fingerprint(at, t, a, ev, keys.ContentOf(payload, headers)), at}
		return nil
	}); err != nil {
		e.t.Fatal(err)
	}
	return out
}

// A delivered mark names its row: this row's mark is a duplicate (marked,
// not sent); a mark of an earlier row with the same id (ids reused, or the
// same id, created_at and names with another payload) is overwritten and
// the row sent; so is a mark of the earlier format, which names no
// payload; a bare "1" of earlier versions is trusted only if it was
// written after the row was created (the upgrade window).
func TestDeliveredMarkNamesItsRow(t *testing.T) {
	e := setup(t)
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
	foreign := keys.Delivered(keys.Fingerprint(earlier, "deal", "0", "deal.funded", keys.Content{}))
	set(ids[0], foreign, keys.DeliveredTTL)                                                                              // an earlier row's mark
	set(ids[1], keys.Delivered(fps[ids[1]].fp), keys.DeliveredTTL)                                                       // this row's mark
	set(ids[2], "1", keys.DeliveredTTL)                                                                                  // legacy, written just now
	set(ids[3], "1", keys.DeliveredTTL-age-keys.LegacySkew-time.Minute)                                                  // legacy, written before the row
	set(ids[4], "1", 0)                                                                                                  // legacy without a TTL: not ours
	set(ids[5], keys.Delivered(keys.Fingerprint(fps[ids[5]].created, "x", "y", "z", keys.Content{})), keys.DeliveredTTL) // same time, other row
	own := fps[ids[6]].fp
	set(ids[6], "1:"+own[:strings.LastIndexByte(own, '.')], keys.DeliveredTTL) // the earlier format: names no payload
	var at time.Time
	var typ, agg, ev string
	if err := e.st.Pool().QueryRow(ctx, `SELECT created_at, aggregate_type, aggregate_id, event_type FROM outbox WHERE id = $1`, ids[7]).
		Scan(&at, &typ, &agg, &ev); err != nil {
		t.Fatal(err)
	}
	reimported := keys.Fingerprint(at, typ, agg, ev, keys.ContentOf([]byte(`{"earlier": "payload"}`), []byte(`{}`)))
	set(ids[7], keys.Delivered(reimported), keys.DeliveredTTL) // same id, created_at and names, another payload

	r := e.poller(testConfig(), "")
	e.run(r)
	e.waitAllDispatched(20 * time.Second)

	ok := e.rc.OKCounts()
	for _, i := range []int{0, 3, 4, 5, 6, 7} {
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
	for _, id := range ids[8:] {
		if ok[id] != 1 {
			t.Errorf("row %d sent %d times, want once", id, ok[id])
		}
	}
	if got := testutil.ToFloat64(r.m.IdempotencyForeign); got != 5 {
		t.Errorf("outboxd_idempotency_foreign_total = %v, want 5 (not the mark of the earlier format)", got)
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
	e := setup(t)
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
	e := setup(t)
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

// The sink is given each row's fingerprint, the one its delivered mark
// names: a broker that deduplicates (Nats-Msg-Id, MessageDeduplicationId)
// drops the same row sent twice and never a new row that reuses an id.
func TestSinkIsGivenTheRowsFingerprint(t *testing.T) {
	e := setup(t)
	ids := e.insert(6, 3)
	fps := e.fingerprints()
	sink := &scripted{dedupe: map[int64]string{}}
	e.run(e.pollerWith(testConfig(), sink))
	e.waitAllDispatched(10 * time.Second)
	sink.mu.Lock()
	defer sink.mu.Unlock()
	for _, id := range ids {
		if got, want := sink.dedupe[id], strconv.FormatInt(id, 10)+":"+fps[id].fp; got != want {
			t.Errorf("row %d: the sink's dedupe id is %q, want %q (the id and the fingerprint of its mark)", id, got, want)
		}
	}
}

// Whose claim a batch takes over at once (claimValue.supersedes): an
// earlier term's (lower token), or an earlier batch of its own term (same
// token and owner). Not a newer term's, and not one of the same token from
// another owner: two acquisitions can get one token after Redis lost its
// data (the counter is floored by the highest token Postgres accepted,
// which the first may not have written yet), and the other one may be
// sending that row now; it is left for the next batch (foreign).
func TestClaimsTakenOverByTokenAndOwner(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	e.insert(1, 1)
	r := e.poller(testConfig(), "")
	res, err := e.st.ReadPath().Read(ctx, store.FetchLimits{Rows: 10}, store.ReadPos{})
	rows := res.Rows
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

// A crashed leader's claims are taken over at once by its successor (a
// higher token), not left to expire: with a claim TTL of an hour, every row
// is still delivered, in order, within seconds.
func TestCrashedLeadersClaimsAreTakenOver(t *testing.T) {
	e := setup(t)
	ids := e.insert(200, 20)
	cfg := testConfig()
	cfg.LockTTL, cfg.BatchSize, cfg.ClaimTTL = time.Second, 100, time.Hour
	c := e.startChild("after-send", cfg) // sent its batch, keys still say "claim"
	_ = c.wait()
	claims := 0
	for _, id := range ids {
		if v, _ := e.rdb.Get(context.Background(), e.prefix+"idempotency:notify:"+fmt.Sprint(id)).Result(); strings.HasPrefix(v, "claim:1:") {
			claims++
		}
	}
	if claims == 0 {
		t.Fatal("the crashed leader left no claims: the test did not hit the window")
	}
	cfg = testConfig()
	cfg.ClaimTTL = time.Hour
	r := e.poller(cfg, "")
	e.run(r)
	e.waitAllDispatched(20 * time.Second) // an hour without the takeover
	e.checkDelivered(ids)
	e.checkOrder()
	if got := testutil.ToFloat64(r.m.ClaimsTakenOver); got != float64(claims) {
		t.Fatalf("took over %v claims, want the %d the crashed leader left", got, claims)
	}
}

// A claim carrying a higher token than ours (a newer leader's) is left
// alone, and its aggregate waits behind it; other aggregates flow.
func TestNewerHoldersClaimIsLeftAlone(t *testing.T) {
	e := setup(t)
	ids := e.insert(20, 10) // deal/0 gets ids[0] and ids[10]
	key := e.prefix + "idempotency:notify:" + fmt.Sprint(ids[0])
	newer := "claim:999:someone-else:x"
	if err := e.rdb.Set(context.Background(), key, newer, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	r := e.poller(testConfig(), "")
	e.run(r)
	e.waitFor("the other aggregates delivered", 10*time.Second, func() bool {
		return e.count("dispatched_at IS NULL") == 2
	})
	for _, r := range e.rc.Requests() {
		if r.Agg == "deal/0" {
			t.Fatalf("event %d of the aggregate behind a newer claim was sent", r.ID)
		}
	}
	if v, _ := e.rdb.Get(context.Background(), key).Result(); v != newer {
		t.Fatalf("the newer claim was replaced by %q", v)
	}
	if n := e.count("attempts > 0"); n != 0 {
		t.Fatalf("%d rows counted attempts while waiting behind a live claim", n)
	}
}

// An idempotency key of the wrong type, or holding a value outboxd did not
// write, fails that row alone: counted, named in last_error, dead-lettered
// after max_attempts; every other row is delivered.
func TestPoisonedIdempotencyKeysFailTheirRowOnly(t *testing.T) {
	e := setup(t)
	ids := e.insert(30, 10)
	ctx := context.Background()
	hashKey := e.prefix + "idempotency:notify:" + fmt.Sprint(ids[3])
	oddKey := e.prefix + "idempotency:notify:" + fmt.Sprint(ids[4])
	if err := e.rdb.HSet(ctx, hashKey, "f", "v").Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.Set(ctx, oddKey, "garbage", 0).Err(); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	cfg.MaxAttempts = 3
	r := e.poller(cfg, "")
	e.run(r)
	e.waitFor("the two poisoned rows dead, all others delivered", 20*time.Second, func() bool {
		return e.count("dead_at IS NOT NULL") == 2 && e.count("dispatched_at IS NOT NULL") == 28
	})
	for _, c := range []struct {
		id   int64
		key  string
		want string
	}{{ids[3], hashKey, "WRONGTYPE"}, {ids[4], oddKey, `"garbage"`}} {
		var attempts int
		var lastErr string
		if err := e.st.Pool().QueryRow(ctx, `SELECT attempts, last_error FROM outbox WHERE id = $1`, c.id).Scan(&attempts, &lastErr); err != nil {
			t.Fatal(err)
		}
		if attempts != 3 || !strings.Contains(lastErr, c.key) || !strings.Contains(lastErr, c.want) {
			t.Errorf("row %d: attempts %d last_error %q; want 3 attempts, the key and %s named", c.id, attempts, lastErr, c.want)
		}
	}
	if typ, _ := e.rdb.Type(ctx, hashKey).Result(); typ != "hash" {
		t.Fatalf("the operator's key was changed to a %s", typ)
	}
}

// claim.lua sent twice for one batch (a Cluster node answered NOSCRIPT and
// the pipeline was sent again) finds the batch's own claim on the keys the
// first run set: those rows are still the batch's to send, not another's.
func TestOwnClaimSeenAgainIsOurs(t *testing.T) {
	e := setup(t)
	e.insert(3, 3)
	r := e.poller(testConfig(), "")
	ctx := context.Background()
	res, err := e.st.ReadPath().Read(ctx, store.FetchLimits{Rows: 10}, store.ReadPos{})
	rows := res.Rows
	if err != nil || len(rows) != 3 {
		t.Fatalf("%d rows, %v", len(rows), err)
	}
	c := claimValue{token: 1, owner: "o", batch: "b"}
	for round := range 2 {
		items := make([]item, len(rows))
		for i, row := range rows {
			items[i].row = row
		}
		if err := r.claimKeys(ctx, items, c); err != nil {
			t.Fatal(err)
		}
		for _, it := range items {
			if it.outcome != pending {
				t.Fatalf("claim run %d: row %d outcome %d, want pending (ours to send)", round+1, it.row.ID, it.outcome)
			}
		}
	}
}
