package pglease

// queries are the lease's statements, each one statement (no transaction
// spans two), with the schema's table names in.
type queries struct {
	acquire, extend, release, holder, lastToken string
}

func newQueries(schema string) queries {
	return queries{
		acquire:   replaceTables(schema, acquireSQL),
		extend:    replaceTables(schema, extendSQL),
		release:   replaceTables(schema, releaseSQL),
		holder:    replaceTables(schema, holderSQL),
		lastToken: replaceTables(schema, lastTokenSQL),
	}
}

// acquireSQL (@lock name, @owner, @instance, @floor, @ttl_ms the TTL in ms)
// takes the lease when its row is missing, expired or released, and
// returns the token and whether the floor or the fence lifted it; else no
// token and the holder seen. cur locks the row first, so the holder named
// and the token compared are the row the upsert judged. The new token is
// greatest(row's token, floor, outbox_fence's token) + 1: excluded.token
// carries greatest(floor, fence) + 1 into the update.
const acquireSQL = `
WITH cur AS (
    SELECT token, owner, instance, expires_at
    FROM {leases} WHERE lock_name = @lock::text
    FOR UPDATE
), lift AS (
    SELECT greatest(@floor::bigint, (SELECT f.token FROM {fence} f WHERE f.lock_name = @lock::text), 0) AS floor
), got AS (
    INSERT INTO {leases} AS l (lock_name, owner, instance, token, expires_at)
    SELECT @lock::text, @owner::text, @instance::text,
           greatest(coalesce((SELECT token FROM cur), 0), lift.floor) + 1,
           now() + @ttl_ms::bigint * interval '1 millisecond'
    FROM lift
    ON CONFLICT (lock_name) DO UPDATE
    SET owner = excluded.owner, instance = excluded.instance,
        token = greatest(l.token + 1, excluded.token),
        expires_at = excluded.expires_at
    WHERE l.expires_at <= now() OR l.owner IS NULL
    RETURNING l.token
)
SELECT (SELECT token FROM got),
       (SELECT floor FROM lift) > coalesce((SELECT token FROM cur), 0),
       (SELECT owner FROM cur),
       (SELECT instance FROM cur),
       (SELECT ceil(extract(epoch FROM expires_at - now()) * 1000)::bigint FROM cur)`

// extendSQL (@lock name, @owner, @token, @ttl_ms the TTL in ms) renews the
// lease if it is still this owner's and not expired; it returns whether it
// did, and else the live owner the statement's snapshot saw (NULL: none).
const extendSQL = `
WITH upd AS (
    UPDATE {leases} SET expires_at = now() + @ttl_ms::bigint * interval '1 millisecond'
    WHERE lock_name = @lock::text AND owner = @owner::text AND token = @token::bigint AND expires_at > now()
    RETURNING 1
)
SELECT (SELECT count(*) FROM upd) = 1,
       (SELECT owner FROM {leases} WHERE lock_name = @lock::text AND expires_at > now())`

// releaseSQL (@lock name, @owner, @token, @channel) ends the lease
// if it is still this owner's, keeping the row and its token, and
// announces it; it returns whether it did, and else the live owner seen.
const releaseSQL = `
WITH rel AS (
    UPDATE {leases} SET owner = NULL, instance = NULL, expires_at = now()
    WHERE lock_name = @lock::text AND owner = @owner::text AND token = @token::bigint AND expires_at > now()
    RETURNING lock_name
), note AS (
    SELECT pg_notify(@channel::text, lock_name) FROM rel
)
SELECT (SELECT count(*) FROM note) = 1,
       (SELECT owner FROM {leases} WHERE lock_name = @lock::text AND expires_at > now())`

// holderSQL (@lock name): the live holder and the milliseconds left on
// Postgres' clock; no row when the lock is free.
const holderSQL = `
SELECT owner, instance, ceil(extract(epoch FROM expires_at - now()) * 1000)::bigint
FROM {leases}
WHERE lock_name = @lock::text AND owner IS NOT NULL AND expires_at > now()`

// lastTokenSQL (@lock name): the last token issued.
const lastTokenSQL = `SELECT token FROM {leases} WHERE lock_name = @lock::text`
