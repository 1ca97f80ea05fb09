-- The idempotency keys of idempotency.store: postgres (outbox_idempotency,
-- store/idempotency.go): what Redis holds at idempotency:notify:<outbox_id>
-- otherwise, with the same values and the same rules (poller/scripts/*.lua).
-- A row whose expires_at is not ahead of Postgres' now() counts as absent.

-- name: idempotency_claim
-- claim.lua: each row whose key is absent (or expired) gets our claim for
-- @ttl_ms; a live key is left as it is. One insert for every id: the
-- common case, every key absent, reads nothing more. Returns only the
-- ids whose claim was not written, each with the value its live key held
-- (the statement's snapshot: the insert's own rows are not in it), NULL
-- when none: another writer claimed the key while this ran.
--
-- It commits asynchronously, as the batch's outcome write does (set_config
-- local, in the statement): a Postgres crash can forget the last claims,
-- and a claim lost that way costs no more than a claim of an earlier term,
-- which the next holder takes over at once anyway; a row whose claim is
-- lost is at worst sent again, never lost.
--   @ids     bigint[]  the rows' ids
--   @value   text      our claim
--   @ttl_ms  bigint    the claim's life, ms
WITH async AS (SELECT set_config('synchronous_commit', 'off', true)),
claimed AS (
  INSERT INTO outbox_idempotency AS i (outbox_id, value, expires_at)
  SELECT w.id, @value::text, now() + @ttl_ms::bigint * interval '1 millisecond'
  FROM unnest(@ids::bigint[]) AS w(id), async
  ON CONFLICT (outbox_id) DO UPDATE SET value = EXCLUDED.value, expires_at = EXCLUDED.expires_at
  WHERE i.expires_at <= now()
  RETURNING i.outbox_id)
SELECT w.id, l.value
FROM unnest(@ids::bigint[]) AS w(id)
LEFT JOIN outbox_idempotency l ON l.outbox_id = w.id AND l.expires_at > now()
WHERE w.id NOT IN (SELECT outbox_id FROM claimed)

-- name: idempotency_take_over
-- takeover.lua: each key that still holds exactly the value seen (and is
-- live) gets our claim for @ttl_ms (compare-and-set: Postgres re-checks a
-- row another writer changed meanwhile). Returns, per id in @ids order, 1
-- taken over, 2 the key holds this row's mark (its holder finished), 0 it
-- changed otherwise.
--   @ids       bigint[]  the rows' ids
--   @previous  text[]    the value seen on each key
--   @marks     text[]    each row's delivered mark
--   @value     text      our claim
--   @ttl_ms    bigint    the claim's life, ms
WITH x AS (SELECT * FROM unnest(@ids::bigint[], @previous::text[], @marks::text[]) WITH ORDINALITY AS x(id, previous, mark, n)),
taken AS (
  UPDATE outbox_idempotency i SET value = @value::text, expires_at = now() + @ttl_ms::bigint * interval '1 millisecond'
  FROM x WHERE i.outbox_id = x.id AND i.value = x.previous AND i.expires_at > now()
  RETURNING i.outbox_id)
SELECT CASE
  WHEN EXISTS (SELECT 1 FROM taken t WHERE t.outbox_id = x.id) THEN 1
  WHEN EXISTS (SELECT 1 FROM outbox_idempotency i WHERE i.outbox_id = x.id AND i.value = x.mark AND i.expires_at > now()) THEN 2
  ELSE 0 END
FROM x ORDER BY x.n

-- fragment: idempotency_settle
-- finish.lua, as more parts of the poller's fenced write of a batch's
-- outcome (Store.CompleteSettled): each sent row's key gets its delivered
-- mark for @mark_ttl_ms if it holds our claim or nothing live (our claim
-- expired during a slow send, and the row was delivered); each key of
-- @release_ids that holds our claim is deleted. Anything else is left
-- alone. None of the parts waits for the fence: like finish.lua, a key is
-- written only while it holds the writer's own claim, which a newer
-- holder replaces (takeover) before it sends.
--
-- The marks are a plain UPDATE of the claims' rows (marked): no
-- speculative insertion, and a HOT update (the table has no index on
-- the columns it changes, and pages kept half free, migration 00016).
-- The keys it did not mark go through the insert with the conflict rule
-- (remarked): a key whose row is gone (an expired claim retention deleted
-- during the send) gets its mark, a key another writer holds live is left
-- alone. In the common case that insert has no row to write.
--   @mark_ids     bigint[]  the sent rows' ids
--   @marks        text[]    their delivered marks
--   @mark_ttl_ms  bigint    the marks' life, ms (24 h)
--   @release_ids  bigint[]  the rows whose claim is dropped
--   @claim        text      our claim
marked AS (
  UPDATE outbox_idempotency i SET value = m.mark, expires_at = now() + @mark_ttl_ms::bigint * interval '1 millisecond'
  FROM unnest(@mark_ids::bigint[], @marks::text[]) AS m(id, mark)
  WHERE i.outbox_id = m.id AND (i.value = @claim::text OR i.expires_at <= now())
  RETURNING i.outbox_id),
remarked AS (
  INSERT INTO outbox_idempotency AS i (outbox_id, value, expires_at)
  SELECT m.id, m.mark, now() + @mark_ttl_ms::bigint * interval '1 millisecond'
  FROM unnest(@mark_ids::bigint[], @marks::text[]) AS m(id, mark)
  WHERE m.id NOT IN (SELECT outbox_id FROM marked)
  ON CONFLICT (outbox_id) DO UPDATE SET value = EXCLUDED.value, expires_at = EXCLUDED.expires_at
  WHERE i.value = @claim::text OR i.expires_at <= now()
  RETURNING 1),
released AS (
  DELETE FROM outbox_idempotency i WHERE i.outbox_id = ANY (@release_ids::bigint[]) AND i.value = @claim::text
  RETURNING 1)

-- name: idempotency_settle
-- The idempotency_settle fragment alone: for a batch whose outcome is
-- written in parts (Store.CompleteSettled after a data exception). Returns
-- the keys changed.
--   @mark_ids     bigint[]  the sent rows' ids
--   @marks        text[]    their delivered marks
--   @mark_ttl_ms  bigint    the marks' life, ms (24 h)
--   @release_ids  bigint[]  the rows whose claim is dropped
--   @claim        text      our claim
WITH {{idempotency_settle}}
SELECT (SELECT count(*) FROM marked) + (SELECT count(*) FROM remarked) + (SELECT count(*) FROM released)

-- name: idempotency_values
-- What the live keys of @ids hold: outbox_id, value (reconciliation's
-- repair sweep reads the delivered marks).
--   @ids  bigint[]  the rows' ids
SELECT outbox_id, value FROM outbox_idempotency WHERE outbox_id = ANY (@ids::bigint[]) AND expires_at > now()

-- name: idempotency_purge
-- Deletes the expired keys among the next @scan keys after @after in
-- outbox_id order, fenced (reconciliation's retention). The table has no
-- index on expires_at (migration 00016): the ids follow the order the
-- events were written, so walking the primary key from the lowest id
-- meets the oldest keys first. Returns the fence's outcome, the keys
-- deleted, the last id scanned, and whether to go on: the window was
-- full and held an expired key (a full window of live keys is where the
-- keys written within their life begin).
--   @lock, @token, @owner  the fence (fence.sql)
--   @after  bigint  the last id an earlier window scanned
--   @scan   int     keys scanned, at most
{{fence}},
win AS MATERIALIZED (
  SELECT outbox_id, expires_at <= now() AS expired FROM outbox_idempotency
  WHERE outbox_id > @after::bigint ORDER BY outbox_id LIMIT @scan::int),
del AS (
  DELETE FROM outbox_idempotency WHERE outbox_id = ANY (ARRAY(SELECT outbox_id FROM win WHERE expired))
  AND expires_at <= now() AND EXISTS (SELECT 1 FROM fence)
  RETURNING 1)
SELECT EXISTS (SELECT 1 FROM fence), (SELECT count(*) FROM del), COALESCE((SELECT max(outbox_id) FROM win), @after::bigint),
  (SELECT count(*) FROM win) = @scan::int AND EXISTS (SELECT 1 FROM win WHERE expired)
