package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/store"
)

// roleSettings gives the role, in dsn's database only, the planner settings
// outboxd needs behind a transaction pooler.
func roleSettings(t *testing.T, st *store.Store) {
	t.Helper()
	_, err := st.Pool().Exec(context.Background(), `DO $$ BEGIN
		EXECUTE format('ALTER ROLE postgres IN DATABASE %I SET plan_cache_mode = force_generic_plan', current_database());
		EXECUTE format('ALTER ROLE postgres IN DATABASE %I SET jit = off', current_database());
		EXECUTE format('ALTER ROLE postgres IN DATABASE %I SET enable_seqscan = off', current_database());
		EXECUTE format('ALTER ROLE postgres IN DATABASE %I SET max_parallel_workers_per_gather = 0', current_database());
	END $$`)
	if err != nil {
		t.Fatal(err)
	}
}

func openVia(t *testing.T, dsn string, opts ...store.Option) *store.Store {
	t.Helper()
	st, err := store.Open(context.Background(), dsn, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st
}

func TestCheckSessionSeesWhatAPoolerDid(t *testing.T) {
	direct, dsn := testenv.Store(t)
	ctx := context.Background()
	if err := direct.CheckSession(ctx); err != nil {
		t.Fatalf("direct to the server: %v", err)
	}
	refusing := testenv.StartPgBouncer(t, dsn)
	ignoring := testenv.StartPgBouncer(t, dsn, "ignore_startup_parameters = jit, plan_cache_mode, enable_seqscan, max_parallel_workers_per_gather")

	var se *store.SessionError
	err := openVia(t, refusing.Via(dsn)).CheckSession(ctx)
	if !errors.As(err, &se) || !strings.Contains(se.Refused, "unsupported startup parameter") {
		t.Errorf("behind PgBouncer that refuses the parameters: %v, want a refusal", err)
	}
	err = openVia(t, ignoring.Via(dsn)).CheckSession(ctx)
	if !errors.As(err, &se) || len(se.Settings) != 4 {
		t.Errorf("behind PgBouncer that drops the parameters: %v, want the four settings named", err)
	}
	err = openVia(t, refusing.Via(dsn), store.WithTransactionPooler()).CheckSession(ctx)
	if !errors.As(err, &se) || len(se.Fix) != 4 || !strings.HasPrefix(se.Fix[0], `ALTER ROLE "postgres" SET `) {
		t.Errorf("pooler transaction, role without the settings: %v, want the four ALTER ROLE statements", err)
	}
	// A role's settings reach the sessions opened after them: PgBouncer's
	// open server sessions keep what they had.
	roleSettings(t, direct)
	fresh := testenv.StartPgBouncer(t, dsn)
	if err := openVia(t, fresh.Via(dsn), store.WithTransactionPooler()).CheckSession(ctx); err != nil {
		t.Errorf("pooler transaction, role with the settings: %v", err)
	}
}

// The fence refuses a stale token through a transaction pooler as it does
// on a session of its own.
func TestStaleFenceIsRejectedThroughATransactionPooler(t *testing.T) {
	direct, dsn := testenv.Store(t)
	roleSettings(t, direct)
	st := openVia(t, testenv.StartPgBouncer(t, dsn).Via(dsn), store.WithTransactionPooler())
	ctx := context.Background()
	if err := st.ClaimFence(ctx, store.Fence{Lock: "lock:outbox:poller", Token: 5, Owner: "a"}); err != nil {
		t.Fatal(err)
	}
	err := st.ClaimFence(ctx, store.Fence{Lock: "lock:outbox:poller", Token: 3, Owner: "b"})
	if !errors.Is(err, store.ErrStaleFence) {
		t.Fatalf("token 3 after 5: %v, want ErrStaleFence", err)
	}
	if tok, err := st.FenceToken(ctx, "lock:outbox:poller"); err != nil || tok != 5 {
		t.Fatalf("fence token %d (%v), want 5", tok, err)
	}
}
