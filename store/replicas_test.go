package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/store"
)

// The replicas list shows the rows seen within the freshness window, the
// leader first; a row older than the window is left out and deleted by the
// next heartbeat of another replica; a replica that stops removes its row.
func TestReplicasListsTheFreshAndPrunesTheStale(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	beat := func(id, role string) {
		t.Helper()
		r := store.Replica{InstanceID: id, Role: role, StartedAt: time.Now(), Version: "v1", HTTPAddr: "127.0.0.1:1"}
		if err := st.Ops().Heartbeat(ctx, r, 15*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	names := func() []string {
		t.Helper()
		rs, err := st.Ops().Replicas(ctx, 15*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range rs {
			out = append(out, r.InstanceID+"="+r.Role)
		}
		return out
	}
	beat("b", "standby")
	beat("gone", "standby")
	beat("a", "standby")
	beat("c", "leader")
	if _, err := st.Pool().Exec(ctx, `UPDATE outbox_replicas SET last_seen = now() - interval '1 minute' WHERE instance_id = 'gone'`); err != nil {
		t.Fatal(err)
	}
	if got := names(); len(got) != 3 || got[0] != "c=leader" || got[1] != "a=standby" || got[2] != "b=standby" {
		t.Fatalf("replicas: %v; want c=leader, a=standby, b=standby", got)
	}
	beat("a", "standby")
	var left int
	if err := st.Pool().QueryRow(ctx, `SELECT count(*) FROM outbox_replicas WHERE instance_id = 'gone'`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("a stale row left after a heartbeat: %d, %v", left, err)
	}
	if err := st.Ops().RemoveReplica(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	if got := names(); len(got) != 2 || got[0] != "a=standby" {
		t.Fatalf("after c stopped: %v; want a, b", got)
	}
}
