package store_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/store"
)

// A pause or resume written by a holder of lock:reconciliation that lost
// its term (a newer token was accepted since) is refused with
// ErrStaleFence and changes nothing: neither the paused set nor the pause
// generation. The holder's own writes report what they changed and raise
// the generation each time; the leader's acknowledgement is fenced by its
// own term and never goes back.
func TestPauseWithAnOldTokenIsRefusedAndChangesNothing(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	older := store.Fence{Lock: "lock:reconciliation", Token: 6, Owner: "owner-6"}
	newer := store.Fence{Lock: "lock:reconciliation", Token: 7, Owner: "owner-7"}
	if err := st.ClaimFence(ctx, older); err != nil {
		t.Fatal(err)
	}
	sw, err := st.Reconcile().PauseDestinations(ctx, older, []string{"payments"})
	if err != nil || !slices.Equal(sw.Names, []string{"payments"}) || sw.Generation != 1 {
		t.Fatalf("pause by the holder: %+v, %v; want payments at generation 1", sw, err)
	}
	if err := st.ClaimFence(ctx, newer); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Reconcile().PauseDestinations(ctx, older, []string{"notify"}); !errors.Is(err, store.ErrStaleFence) {
		t.Fatalf("pause with token 6 after 7: %v, want ErrStaleFence", err)
	}
	if _, err := st.Reconcile().ResumeDestinations(ctx, older, store.Resume{Names: nil, All: true}); !errors.Is(err, store.ErrStaleFence) {
		t.Fatalf("resume --all with token 6 after 7: %v, want ErrStaleFence", err)
	}
	ps, err := st.ReadPath().ReadPauseSet(ctx)
	if err != nil || !slices.Equal(ps.Names, []string{"payments"}) || ps.Generation != 1 {
		t.Fatalf("after the stale writes: %+v, %v; want payments alone at generation 1", ps, err)
	}

	sw, err = st.Reconcile().ResumeDestinations(ctx, newer, store.Resume{Names: nil, All: true})
	if err != nil || !slices.Equal(sw.Names, []string{"payments"}) || sw.Generation != 2 {
		t.Fatalf("resume --all by the new holder: %+v, %v; want payments at generation 2", sw, err)
	}

	leader := store.Fence{Lock: "lock:outbox:poller", Token: 3, Owner: "leader-3"}
	if err := st.ClaimFence(ctx, leader); err != nil {
		t.Fatal(err)
	}
	if err := st.ReadPath().AckPause(ctx, leader, 2); err != nil {
		t.Fatal(err)
	}
	if err := st.ReadPath().AckPause(ctx, leader, 1); err != nil {
		t.Fatal(err)
	}
	if n, err := st.Ops().PauseApplied(ctx); err != nil || n != 2 {
		t.Fatalf("applied %d, %v; want 2 (never back)", n, err)
	}
	if err := st.ClaimFence(ctx, store.Fence{Lock: leader.Lock, Token: 4, Owner: "leader-4"}); err != nil {
		t.Fatal(err)
	}
	if err := st.ReadPath().AckPause(ctx, leader, 3); !errors.Is(err, store.ErrStaleFence) {
		t.Fatalf("acknowledgement by a superseded leader: %v, want ErrStaleFence", err)
	}
}
