-- +goose Up
-- The owner (lock acquisition UUID) that raised the fence: an equal token is
-- accepted only from the same owner, so two holders that ended up with the
-- same token (a Redis failover that lost the counter) cannot both write.
ALTER TABLE outbox_fence ADD COLUMN owner text;

-- +goose Down
ALTER TABLE outbox_fence DROP COLUMN owner;
