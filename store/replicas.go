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

// heartbeatSQL writes the replica's row (last_seen = now()) and deletes the
// rows not seen within $7 (replicas gone without saying so).
const heartbeatSQL = `WITH pruned AS (
  DELETE FROM outbox_replicas WHERE last_seen < now() - $6 * interval '1 millisecond' AND instance_id <> $1)
INSERT INTO outbox_replicas (instance_id, role, started_at, last_seen, version, http_addr)
VALUES ($1, $2, $3, now(), $4, $5)
ON CONFLICT (instance_id) DO UPDATE SET role = $2, started_at = $3, last_seen = now(), version = $4, http_addr = $5`

// Heartbeat records r as running now and deletes the rows of replicas not
// seen for longer than stale.
func (s *Store) Heartbeat(ctx context.Context, r Replica, stale time.Duration) error {
	if _, err := s.pool.Exec(ctx, heartbeatSQL, r.InstanceID, r.Role, r.StartedAt, r.Version, r.HTTPAddr, stale.Milliseconds()); err != nil {
		return wrap("replica heartbeat", err)
	}
	return nil
}

// RemoveReplica deletes the row of instanceID, written by the replica that
// stops.
func (s *Store) RemoveReplica(ctx context.Context, instanceID string) error {
	if _, err := s.pool.Exec(ctx, `DELETE FROM outbox_replicas WHERE instance_id = $1`, instanceID); err != nil {
		return wrap("remove replica", err)
	}
	return nil
}

// Replicas lists the replicas seen within fresh, the leader first, then by
// instance_id.
func (s *Store) Replicas(ctx context.Context, fresh time.Duration) ([]Replica, error) {
	rows, err := s.pool.Query(ctx, `SELECT instance_id, role, started_at, last_seen, version, http_addr
FROM outbox_replicas WHERE last_seen >= now() - $1 * interval '1 millisecond'
ORDER BY role <> 'leader', instance_id`, fresh.Milliseconds())
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
