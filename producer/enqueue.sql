-- Enqueue's statement: one row per event, in the order given, in one
-- round trip. The table is put in place of the verb below: outbox, or
-- schema-qualified (EnqueueIn), an identifier, which cannot be a parameter.
--   @types         text[]         aggregate_type of each event
--   @ids           text[]         aggregate_id
--   @event_types   text[]         event_type
--   @payloads      text[]         payload, JSON text
--   @headers       text[]         headers, a JSON object's text
--   @available_at  timestamptz[]  available_at; NULL: now()
INSERT INTO %s (aggregate_type, aggregate_id, event_type, payload, headers, available_at)
SELECT t, a, e, p::jsonb, h::jsonb, COALESCE(v, now())
FROM unnest(@types::text[], @ids::text[], @event_types::text[], @payloads::text[], @headers::text[], @available_at::timestamptz[]) AS x(t, a, e, p, h, v)
