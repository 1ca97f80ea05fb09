package app

import (
	"context"
	"time"

	"github.com/outboxd/outboxd/internal/buildinfo"
	"github.com/outboxd/outboxd/store"
)

// ReplicaHeartbeat is how often a running replica writes its row in
// outbox_replicas; a row not written for ReplicaFresh is no longer shown
// and is deleted by the next heartbeat of any replica.
const (
	ReplicaHeartbeat = 5 * time.Second
	ReplicaFresh     = 3 * ReplicaHeartbeat
)

// roleCheck is how often the heartbeat looks at the replica's role: a
// change is written at once, not at the next heartbeat.
const roleCheck = 250 * time.Millisecond

// heartbeat keeps this replica's row in outbox_replicas (`status`'s
// replicas) while ctx lives: written at once, every ReplicaHeartbeat, and
// whenever leads changes; deleted when ctx ends. Unfenced: it is not
// outbox data. Postgres down: it keeps trying, saying so once per outage.
func (a *App) heartbeat(ctx context.Context, httpAddr string, leads func() bool) {
	self := store.Replica{InstanceID: a.Cfg.InstanceID, StartedAt: time.Now(), Version: buildinfo.Get().Version, HTTPAddr: httpAddr}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		if err := a.Store.Ops().RemoveReplica(rctx, self.InstanceID); err != nil {
			a.Log.Warn("replica heartbeat failed", "error", err)
		}
	}()
	tick := time.NewTicker(roleCheck)
	defer tick.Stop()
	var written time.Time
	failing := false
	for {
		role := "standby"
		if leads() {
			role = "leader"
		}
		if role != self.Role || time.Since(written) >= ReplicaHeartbeat {
			next := self
			next.Role = role
			wctx, cancel := context.WithTimeout(ctx, ReplicaHeartbeat)
			err := a.Store.Ops().Heartbeat(wctx, next, ReplicaFresh)
			cancel()
			switch {
			case err == nil:
				self, written, failing = next, time.Now(), false
			case ctx.Err() == nil && !failing:
				failing = true
				a.Log.Warn("replica heartbeat failed", "error", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
