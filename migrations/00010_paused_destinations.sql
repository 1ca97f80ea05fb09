-- +goose Up
-- Destinations an operator paused (`outboxd pause`): the leader sends none
-- of their events until `outboxd resume`; the events stay pending and are
-- charged no attempt. Written fenced under lock:reconciliation (token: the
-- writer's); every leader reads it each second.
CREATE TABLE outbox_paused_destinations (
    destination text        PRIMARY KEY,
    paused_at   timestamptz NOT NULL DEFAULT now(),
    token       bigint      NOT NULL
);

-- +goose Down
DROP TABLE outbox_paused_destinations;
