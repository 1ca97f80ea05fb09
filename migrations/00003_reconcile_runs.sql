-- +goose Up
-- One row per reconciliation fire time that ran, written fenced with the
-- lock:reconciliation token: a fire time runs once across replicas even when
-- their clocks differ and a fast sweep releases the lock before a slower
-- replica fires.
CREATE TABLE reconcile_runs (
    fire_time   timestamptz PRIMARY KEY,
    token       bigint      NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    summary     jsonb
);

-- +goose Down
DROP TABLE reconcile_runs;
