-- The running replicas (outbox_replicas): each `outboxd run` reports
-- itself, unfenced (not outbox data).

-- name: heartbeat
-- Writes the replica's row (last_seen = now(), Postgres' clock) and
-- deletes the rows of others not seen within @stale_ms.
--   @instance_id  text         the replica's instance_id
--   @role         text         leader or standby
--   @started_at   timestamptz  when it started
--   @version      text         its version
--   @http_addr    text         its ops port
--   @stale_ms     bigint       how long a silent replica stays listed
WITH pruned AS (
  DELETE FROM outbox_replicas WHERE last_seen < now() - @stale_ms::bigint * interval '1 millisecond' AND instance_id <> @instance_id::text)
INSERT INTO outbox_replicas (instance_id, role, started_at, last_seen, version, http_addr)
VALUES (@instance_id::text, @role::text, @started_at::timestamptz, now(), @version::text, @http_addr::text)
ON CONFLICT (instance_id) DO UPDATE SET role = @role::text, started_at = @started_at::timestamptz, last_seen = now(),
  version = @version::text, http_addr = @http_addr::text

-- name: remove_replica
-- Deletes the row of the replica that stops.
--   @instance_id  text  its instance_id
DELETE FROM outbox_replicas WHERE instance_id = @instance_id::text

-- name: replicas
-- The replicas seen within @fresh_ms, the leader first, then by
-- instance_id: instance_id, role, started_at, last_seen, version, http_addr.
--   @fresh_ms  bigint  how recent a last_seen counts
SELECT instance_id, role, started_at, last_seen, version, http_addr
FROM outbox_replicas WHERE last_seen >= now() - @fresh_ms::bigint * interval '1 millisecond'
ORDER BY role <> 'leader', instance_id
