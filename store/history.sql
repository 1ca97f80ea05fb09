-- name: history
-- A row's recorded failed attempts, oldest first (written by complete.sql):
-- attempt, at, kind, excerpt, duration_ms, fencing_token.
--   @id          bigint       the row's id
--   @created_at  timestamptz  its created_at: the history of an earlier row with the id is not shown
SELECT attempt, at, kind, excerpt, duration_ms, fencing_token
FROM outbox_attempts WHERE outbox_id = @id AND created_at = @created_at ORDER BY attempt
