-- +goose Up
-- The replicas running `outboxd run` (`outboxd status`, /status): each
-- writes its row every few seconds (last_seen: Postgres' now()) and deletes
-- it when it stops; a row not seen for three intervals is no longer shown
-- and is deleted by the next heartbeat of any replica. Not outbox data:
-- written unfenced. role is leader (holds lock:outbox:poller) or standby.
CREATE TABLE outbox_replicas (
    instance_id text        PRIMARY KEY,
    role        text        NOT NULL,
    started_at  timestamptz NOT NULL,
    last_seen   timestamptz NOT NULL DEFAULT now(),
    version     text        NOT NULL,
    http_addr   text        NOT NULL
);

-- +goose Down
DROP TABLE outbox_replicas;
