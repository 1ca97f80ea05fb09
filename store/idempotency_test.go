package store_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/internal/testkit"
	"github.com/outboxd/outboxd/store"
)

// keysBundle is a store with the fence of lock:outbox:poller raised to 5,
// and helpers to read and age its idempotency keys.
type keysBundle struct {
	t     *testing.T
	st    *store.Store
	ctx   context.Context
	fence store.Fence
}

func keysSetup(t *testing.T) *keysBundle {
	t.Helper()
	t.Parallel()
	st, _ := testenv.Store(t)
	b := &keysBundle{t: t, st: st, ctx: context.Background(), fence: store.Fence{Lock: "lock:outbox:poller", Token: 5, Owner: "o5"}}
	if err := st.ClaimFence(b.ctx, b.fence); err != nil {
		t.Fatal(err)
	}
	return b
}

// value is what key id holds, live or not ("" for no row).
func (b *keysBundle) value(id int64) string {
	b.t.Helper()
	var v string
	err := b.st.Pool().QueryRow(b.ctx, `SELECT value FROM outbox_idempotency WHERE outbox_id = @id`, pgx.NamedArgs{"id": id}).Scan(&v)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		b.t.Fatal(err)
	}
	return v
}

// expire makes key id expired, as if its TTL had passed.
func (b *keysBundle) expire(id int64) {
	b.t.Helper()
	_, err := b.st.Pool().Exec(b.ctx, `UPDATE outbox_idempotency SET expires_at = now() - interval '1 second' WHERE outbox_id = @id`, pgx.NamedArgs{"id": id})
	if err != nil {
		b.t.Fatal(err)
	}
}

func (b *keysBundle) claim(value string, ids ...int64) []store.KeyClaim {
	b.t.Helper()
	got, err := b.st.ReadPath().ClaimKeys(b.ctx, ids, value, time.Minute)
	if err != nil {
		b.t.Fatal(err)
	}
	return got
}

// A claim is written only where no live value is; a live one is reported
// and left; an expired one counts as absent.
func TestClaimKeysWritesOnlyWhereNothingLiveIs(t *testing.T) {
	b := keysSetup(t)
	if got := b.claim("claim:4:o4:a", 1, 2); !got[0].Ours || !got[1].Ours {
		t.Fatalf("first claims %+v, want both ours", got)
	}
	b.expire(2)
	got := b.claim("claim:5:o5:b", 1, 2, 3)
	want := []store.KeyClaim{{Found: "claim:4:o4:a"}, {Ours: true}, {Ours: true}}
	if !slices.Equal(got, want) {
		t.Fatalf("claims %+v, want %+v", got, want)
	}
	if v := b.value(1); v != "claim:4:o4:a" {
		t.Errorf("a live claim was overwritten: %q", v)
	}
}

// A takeover replaces exactly the value seen: a claim that changed since is
// left alone (0), one its holder turned into the row's mark reports
// delivered (2).
func TestTakeOverKeysIsCompareAndSet(t *testing.T) {
	b := keysSetup(t)
	b.claim("claim:4:o4:a", 1, 2, 3)
	// Key 2 moved on to a newer holder, key 3 was marked delivered, after
	// the values were seen.
	if _, err := b.st.Pool().Exec(b.ctx, `UPDATE outbox_idempotency SET value = CASE outbox_id WHEN 2 THEN 'claim:6:o6:x' ELSE '1:fp3' END WHERE outbox_id IN (2, 3)`); err != nil {
		t.Fatal(err)
	}
	got, err := b.st.ReadPath().TakeOverKeys(b.ctx, []int64{1, 2, 3}, []string{"claim:4:o4:a", "claim:4:o4:a", "claim:4:o4:a"},
		[]string{"1:fp1", "1:fp2", "1:fp3"}, "claim:5:o5:b", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int{store.KeyTaken, store.KeyChanged, store.KeyDelivered}; !slices.Equal(got, want) {
		t.Fatalf("takeovers %v, want %v", got, want)
	}
	for id, want := range map[int64]string{1: "claim:5:o5:b", 2: "claim:6:o6:x", 3: "1:fp3"} {
		if v := b.value(id); v != want {
			t.Errorf("key %d holds %q, want %q", id, v, want)
		}
	}
}

// The batch's end, written with its fenced outcome: a key holding our
// claim, or nothing live, gets the row's mark for 24 h; a key a newer
// holder took over keeps that holder's claim; a release drops only our own
// claim. The keys are written even when the fence refuses the outcome, as
// finish.lua writes them beside a refused Complete.
func TestCompleteSettledWritesOnlyOverOurOwnClaim(t *testing.T) {
	for _, tc := range []struct {
		name  string
		token int64
		fence error
	}{
		{"fence accepted", 5, nil},
		{"fence refused", 3, store.ErrStaleFence},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := keysSetup(t)
			ours := "claim:5:o5:b"
			b.claim(ours, 1, 3, 5)
			b.claim("claim:9:o9:z", 2, 4, 7) // a newer holder's
			b.expire(7)                      // 7: nothing live
			// 6: no key at all (our claim expired during the send).
			f := b.fence
			f.Token = tc.token
			_, err := b.st.ReadPath().CompleteSettled(b.ctx, f, store.Outcomes{}, store.Settle{Claim: ours, MarkTTL: 24 * time.Hour,
				MarkIDs: []int64{1, 2, 6, 7}, Marks: []string{"1:fp1", "1:fp2", "1:fp6", "1:fp7"}, ReleaseIDs: []int64{3, 4}})
			if !errors.Is(err, tc.fence) {
				t.Fatalf("complete: %v, want %v", err, tc.fence)
			}
			for id, want := range map[int64]string{1: "1:fp1", 2: "claim:9:o9:z", 3: "", 4: "claim:9:o9:z", 5: ours, 6: "1:fp6", 7: "1:fp7"} {
				if v := b.value(id); v != want {
					t.Errorf("key %d holds %q, want %q", id, v, want)
				}
			}
			var left time.Duration
			if err := b.st.Pool().QueryRow(b.ctx, `SELECT extract(epoch FROM expires_at - now())::float8 * interval '1 second' FROM outbox_idempotency WHERE outbox_id = 1`).Scan(&left); err != nil {
				t.Fatal(err)
			}
			if left <= time.Hour || left > 24*time.Hour {
				t.Errorf("the mark lives %s, want 24 h", left)
			}
		})
	}
}

// The combined statement still writes the batch's outcome: the delivered
// row is marked in Postgres.
func TestCompleteSettledMarksTheRowsDelivered(t *testing.T) {
	b := keysSetup(t)
	enqueue(t, b.st, ev("order", "1", 1))
	d := done(t, b.st, 1)
	b.claim("claim:5:o5:b", 1)
	got, err := b.st.ReadPath().CompleteSettled(b.ctx, b.fence, store.Outcomes{Delivered: d}, store.Settle{Claim: "claim:5:o5:b", MarkTTL: time.Hour,
		MarkIDs: []int64{1}, Marks: []string{"1:fp1"}})
	if err != nil || got.Delivered != 1 {
		t.Fatalf("complete: %d delivered, %v", got.Delivered, err)
	}
	if s := state(t, b.st, 1); !s.dispatched {
		t.Error("the row is not marked delivered")
	}
	if v := b.value(1); v != "1:fp1" {
		t.Errorf("key holds %q, want the mark", v)
	}
}

// An expired key reads as absent, and retention deletes the expired keys
// alone, fenced.
func TestExpiredKeysReadAsAbsentAndArePurged(t *testing.T) {
	b := keysSetup(t)
	b.claim("claim:5:o5:b", 1, 2, 3)
	b.expire(2)
	b.expire(3)
	vals, err := b.st.Reconcile().KeyValues(b.ctx, []int64{1, 2, 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(vals) != 1 || vals[1] != "claim:5:o5:b" {
		t.Errorf("live keys %v, want 1 alone", vals)
	}
	stale := b.fence
	stale.Token = 3
	if _, err := b.st.Reconcile().PurgeKeys(b.ctx, stale, 0, 10); !errors.Is(err, store.ErrStaleFence) {
		t.Fatalf("a stale purge: %v, want refused", err)
	}
	if b.value(2) == "" || b.value(3) == "" {
		t.Fatal("a stale purge deleted keys")
	}
	p, err := b.st.Reconcile().PurgeKeys(b.ctx, b.fence, 0, 2)
	if err != nil || p != (store.KeyPurge{Deleted: 1, Last: 2, More: true}) {
		t.Fatalf("purge of the window (0, 2]: %+v, %v; want key 2 deleted and more to scan", p, err)
	}
	p, err = b.st.Reconcile().PurgeKeys(b.ctx, b.fence, p.Last, 2)
	if err != nil || p != (store.KeyPurge{Deleted: 1, Last: 3, More: false}) {
		t.Fatalf("purge of the window after 2: %+v, %v; want key 3 deleted and the end of the table", p, err)
	}
	if b.value(1) == "" || b.value(2) != "" || b.value(3) != "" {
		t.Error("purge deleted a live key or left an expired one")
	}
}

// The purge walks the keys in id order and stops at the first full window
// without an expired key: the keys above it were written later.
func TestPurgeKeysStopsAtAWindowOfLiveKeys(t *testing.T) {
	b := keysSetup(t)
	b.claim("claim:5:o5:b", 1, 2, 3, 4, 5)
	b.expire(1)
	b.expire(5)
	p, err := b.st.Reconcile().PurgeKeys(b.ctx, b.fence, 0, 2)
	if err != nil || p != (store.KeyPurge{Deleted: 1, Last: 2, More: true}) {
		t.Fatalf("first window: %+v, %v; want key 1 deleted and more to scan", p, err)
	}
	p, err = b.st.Reconcile().PurgeKeys(b.ctx, b.fence, p.Last, 2)
	if err != nil || p != (store.KeyPurge{Deleted: 0, Last: 4, More: false}) {
		t.Fatalf("a window of live keys: %+v, %v; want nothing deleted and the walk ended", p, err)
	}
	if b.value(1) != "" || b.value(5) == "" {
		t.Error("the walk deleted past its end, or left the expired key it scanned")
	}
}

// A key another writer claims while ClaimKeys runs (its insert committed
// after ClaimKeys read the table) is left to that writer and reported as
// neither ours nor found: the row waits for a later batch.
func TestClaimKeysLeavesAKeyClaimedMeanwhile(t *testing.T) {
	b := keysSetup(t)
	tx, err := b.st.Pool().Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(b.ctx) }()
	if _, err := tx.Exec(b.ctx, `INSERT INTO outbox_idempotency VALUES (7, 'claim:9:o9:z', now() + interval '1 minute')`); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		got []store.KeyClaim
		err error
	}
	done := make(chan answer, 1)
	go func() {
		got, err := b.st.ReadPath().ClaimKeys(b.ctx, []int64{7}, "claim:5:o5:b", time.Minute)
		done <- answer{got, err}
	}()
	testkitWait(t, "ClaimKeys waits for the other writer", func() bool {
		var n int
		err := b.st.Pool().QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
		return err == nil && n > 0
	})
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	a := <-done
	if a.err != nil || len(a.got) != 1 || a.got[0] != (store.KeyClaim{}) {
		t.Fatalf("claim: %+v %v, want neither ours nor found", a.got, a.err)
	}
	if v := b.value(7); v != "claim:9:o9:z" {
		t.Errorf("the other writer's claim was overwritten: %q", v)
	}
}

// testkitWait polls cond until it holds (testkit.WaitFor's bound).
func testkitWait(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testkit.WaitFor(t, 20*time.Second, what, cond, func() string { return "" })
}
