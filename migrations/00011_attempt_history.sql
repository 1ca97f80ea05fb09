-- +goose Up
-- The last failed attempts of each row (the attempt history of `outboxd
-- dead show`), written in the same fenced statement that records the
-- failure: attempt is the row's attempts after it; at is Postgres' now();
-- kind is the failure's kind (http_503, timeout, connection, ...); excerpt
-- the start of the failure's text; duration_ms the send's, when the sink
-- measured it; fencing_token the writer's. created_at binds the entries to
-- their row (an id handed out again is another row). Entries go with their
-- row when it is purged; at most the last 10 of a row are kept.
CREATE TABLE outbox_attempts (
    outbox_id     bigint      NOT NULL,
    attempt       int         NOT NULL,
    created_at    timestamptz NOT NULL,
    at            timestamptz NOT NULL DEFAULT now(),
    kind          text        NOT NULL,
    excerpt       text        NOT NULL,
    duration_ms   bigint,
    fencing_token bigint      NOT NULL,
    PRIMARY KEY (outbox_id, attempt)
);

-- +goose Down
DROP TABLE outbox_attempts;
