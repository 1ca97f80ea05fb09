package blackbox

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// A broker that deduplicates takes a row's dedupe id from what names the
// row (its id and fingerprint, as its idempotency mark does), so a rewind
// inside the broker's window delivers every new row; and the fingerprint
// covers the payload, so rows written again with the ids, created_at and
// names of delivered rows but other payloads are new rows.

// TestNATSRewindWithinTheDuplicateWindow: 3 rows go to a JetStream stream
// (its duplicate window JetStream's default, 2 min); TRUNCATE ... RESTART
// IDENTITY; 3 new rows with the same ids, a moment later, are all stored.
func TestNATSRewindWithinTheDuplicateWindow(t *testing.T) {
	t.Parallel()
	ns := newNATSStream(t, ">")
	e := natsEnv(t, ns)
	rep := e.start()
	truncateAndWrite(e, rep, func(gen int) []int64 { return e.insertGen(gen, 3) })

	stored := map[int]map[int]int{} // generation -> n -> messages
	for _, m := range ns.consume() {
		var p struct{ Gen, N int }
		if err := json.Unmarshal(m.Data(), &p); err != nil {
			t.Fatalf("message %s: %v", m.Data(), err)
		}
		if stored[p.Gen] == nil {
			stored[p.Gen] = map[int]int{}
		}
		stored[p.Gen][p.N]++
		if id := m.Headers().Get("id"); m.Headers().Get("Nats-Msg-Id") == id {
			t.Errorf("message %s: Nats-Msg-Id is the bare id %s, want the id and the row's fingerprint", m.Data(), id)
		}
	}
	for gen := 1; gen <= 2; gen++ {
		for n := 1; n <= 3; n++ {
			if stored[gen][n] != 1 {
				t.Errorf("generation %d row %d stored %d times, want once; stream: %v", gen, n, stored[gen][n], stored)
			}
		}
	}
	if n := rep.metric(t, "outboxd_already_delivered_total"); n != 0 {
		t.Errorf("outboxd_already_delivered_total = %v, want 0", n)
	}
}

// TestReimportWithTheSameCreatedAtIsDelivered: a producer that sets
// created_at itself delivers 5 rows, then after TRUNCATE ... RESTART
// IDENTITY writes them again with the same ids, created_at and names and
// new payloads: each of the 5 reaches the receiver, none is taken for
// already delivered.
func TestReimportWithTheSameCreatedAtIsDelivered(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rc := newRecorder(t, nil)
	e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", rc.URL())
	rep := e.start()
	truncateAndWrite(e, rep, func(gen int) []int64 { return e.insertImport(gen, 5) })
	got := okGen(rc, 2)
	for n := 1; n <= 5; n++ {
		if got[n] != 1 {
			t.Errorf("re-imported row %d received %d times, want once (received: %v)", n, got[n], got)
		}
	}
	if n := rep.metric(t, "outboxd_already_delivered_total"); n != 0 {
		t.Errorf("outboxd_already_delivered_total = %v, want 0: re-imported rows were marked delivered unsent", n)
	}
}

// insertImport inserts n rows as an import that sets created_at itself
// writes them: created_at fixed per row (the same in every generation),
// the same names, payload {"gen": gen, "n": i}.
func (e *testBundle) insertImport(gen, n int) []int64 {
	e.t.Helper()
	return e.insertIDs(`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at)
		 SELECT 'imp', (g % 2)::text, 'test.event', jsonb_build_object('gen', $1::int, 'n', g),
		   timestamptz '2026-01-02 03:04:05.123456+00' + g * interval '1 second'
		 FROM generate_series(1, $2::int) g ORDER BY g RETURNING id`, gen, n)
}

// truncateAndWrite writes generation 1 with write and waits for its
// delivery, empties the table with TRUNCATE ... RESTART IDENTITY, writes
// generation 2 (its ids from 1 again) and waits until it is settled.
func truncateAndWrite(e *testBundle, rep *replica, write func(gen int) []int64) {
	t := e.t
	t.Helper()
	write(1)
	waitFor(t, "generation 1 delivered", func() bool { return e.count(`dispatched_at IS NULL`) == 0 }, e.describeRows("true"))
	e.exec(`TRUNCATE outbox RESTART IDENTITY`)
	if ids := write(2); ids[0] != 1 {
		t.Fatalf("the rewind did not rewind: the first new id is %d", ids[0])
	}
	e.waitSettled(rep, "generation 2 settled")
}

// dedupeID is what a broker that deduplicates must be given for row id
// (decimal): the id, a colon and the fingerprint its delivered mark
// "1:<fingerprint>" names, read from Redis after its delivery.
func (e *testBundle) dedupeID(id string) string {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	mark, err := e.rdb.Get(ctx, e.prefix+"idempotency:notify:"+id).Result()
	if err != nil || !strings.HasPrefix(mark, "1:") {
		e.t.Fatalf("row %s's idempotency key holds %q (%v), want its delivered mark", id, mark, err)
	}
	return id + ":" + strings.TrimPrefix(mark, "1:")
}
