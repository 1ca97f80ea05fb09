-- name: check_session
-- The session's current_schema() and the values of the settings @names,
-- in their order (Store.CheckSession).
--   @names  text[]  setting names
SELECT COALESCE(current_schema(), ''),
		ARRAY(SELECT current_setting(n) FROM unnest(@names::text[]) WITH ORDINALITY AS x(n, i) ORDER BY i)

-- name: notify_trigger_exists
-- Whether outbox has its NOTIFY trigger (poller.notify).
SELECT EXISTS (SELECT 1 FROM pg_trigger
		WHERE tgname = 'outbox_notify' AND tgrelid = 'outbox'::regclass)

-- name: notify_trigger_create
-- Installs the insert trigger that NOTIFYs outbox_events once per
-- inserting statement (the function is migration 00001's).
CREATE OR REPLACE TRIGGER outbox_notify AFTER INSERT ON outbox
		       FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify()

-- name: notify_trigger_drop
-- Removes that trigger.
DROP TRIGGER IF EXISTS outbox_notify ON outbox

-- name: ddl_lock_timeout
-- Before DDL on outbox: never queue behind a long transaction while
-- blocking producers.
SET LOCAL lock_timeout = '5s'
