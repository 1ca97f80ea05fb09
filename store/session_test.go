package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/store"
)

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
	// Behind a transaction pooler the settings come with each
	// transaction: the role as it is will do.
	if err := openVia(t, refusing.Via(dsn), store.WithTransactionPooler()).CheckSession(ctx); err != nil {
		t.Errorf("pooler transaction, role without settings: %v", err)
	}
}

// A statement prepared on a connection and gone at its next use (what a
// transaction pooler does when the next use reaches another server
// session) is a SessionError, not a server that did not answer: the start
// stops, naming the pooler, instead of retrying for ever.
func TestCheckSessionSeesAPreparedStatementGone(t *testing.T) {
	_, dsn := testenv.Store(t)
	st := oneSession(t, dsn, nil)
	ctx := context.Background()
	if err := st.CheckSession(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Pool().Exec(ctx, "DEALLOCATE ALL", pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatal(err)
	}
	var se *store.SessionError
	if err := st.CheckSession(ctx); !errors.As(err, &se) || !strings.Contains(se.Unprepared, "does not exist") {
		t.Fatalf("after the session lost its prepared statements: %v, want a SessionError saying so", err)
	}
}

// The fence refuses a stale token through a transaction pooler as it does
// on a session of its own.
func TestStaleFenceIsRejectedThroughATransactionPooler(t *testing.T) {
	_, dsn := testenv.Store(t)
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
