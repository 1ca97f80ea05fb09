package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// Replica is one running `outboxd run` as it last reported itself
// (Heartbeat). Not outbox data: written unfenced.
type Replica struct {
	InstanceID string    `json:"instance_id"`
	Role       string    `json:"role"` // "leader" (holds lock:outbox:poller) or "standby"
	StartedAt  time.Time `json:"started_at"`
	LastSeen   time.Time `json:"last_seen"` // Postgres' clock
	Version    string    `json:"version"`
	HTTPAddr   string    `json:"http_addr"`
}

// The statements of replicas.sql.
var (
	heartbeatQ     = stmt("heartbeat")
	removeReplicaQ = stmt("remove_replica")
	replicasQ      = stmt("replicas")
)

// Heartbeat records r as running now and deletes the rows of replicas not
// seen for longer than stale.
func (s Ops) Heartbeat(ctx context.Context, r Replica, stale time.Duration) error {
	if err := heartbeatQ.exec(ctx, s.db, pgx.NamedArgs{
		"instance_id": r.InstanceID, "role": r.Role, "started_at": r.StartedAt,
		"version": r.Version, "http_addr": r.HTTPAddr, "stale_ms": stale.Milliseconds(),
	}); err != nil {
		return wrap("replica heartbeat", err)
	}
	return nil
}

// RemoveReplica deletes the row of instanceID, written by the replica that
// stops.
func (s Ops) RemoveReplica(ctx context.Context, instanceID string) error {
	if err := removeReplicaQ.exec(ctx, s.db, pgx.NamedArgs{"instance_id": instanceID}); err != nil {
		return wrap("remove replica", err)
	}
	return nil
}

// Replicas lists the replicas seen within fresh, the leader first, then by
// instance_id.
func (s Ops) Replicas(ctx context.Context, fresh time.Duration) ([]Replica, error) {
	rows, err := replicasQ.query(ctx, s.db, pgx.NamedArgs{"fresh_ms": fresh.Milliseconds()})
	if err != nil {
		return nil, wrap("replicas", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Replica])
	if err != nil {
		return nil, wrap("replicas", err)
	}
	for i := range out {
		out[i].StartedAt, out[i].LastSeen = out[i].StartedAt.UTC(), out[i].LastSeen.UTC()
	}
	return out, nil
}
