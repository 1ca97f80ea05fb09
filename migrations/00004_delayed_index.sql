-- +goose Up
-- Only delayed pending rows (backing off after a failure, or scheduled by the
-- producer): the poll's "does an earlier row of this aggregate wait?" check
-- probes this tiny index instead of scanning every pending row. Rows inserted
-- with the default available_at (= created_at) never enter it, so producers
-- pay nothing for it.
CREATE INDEX outbox_delayed_idx ON outbox (aggregate_type, aggregate_id, id)
    WHERE dispatched_at IS NULL AND dead_at IS NULL AND available_at > created_at;

-- +goose Down
DROP INDEX outbox_delayed_idx;
