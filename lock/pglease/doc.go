// Package pglease is the Postgres lease: a lock.Lease whose leases live in
// outboxd's own table, outbox_leases (migrations/00014_leases.sql), one row
// per lock, judged on Postgres' clock.
//
// What it guarantees, beside what lock.Lease promises:
//
//   - Acquire is one statement: INSERT … ON CONFLICT (lock_name) DO UPDATE
//     … WHERE the row's lease has expired (expires_at <= now()) or been
//     released. It sets a fresh owner (a UUID per acquisition), the
//     instance, expires_at = now() + TTL and the token
//     greatest(row's token, lock.Options.Floor, outbox_fence's token) + 1,
//     reading outbox_fence in the same statement. So the token sequence
//     never goes below the highest token Postgres accepted, also when a
//     deployment switches to this backend from another one.
//   - Expiry is Postgres' now() passing expires_at: a holder that stops
//     renewing (SIGSTOP, a partition) loses the lease within its TTL, on
//     Postgres' clock, whatever the holder's clock says. No session state
//     holds the lease (no advisory lock), so a stopped process that keeps
//     its connection holds nothing past its TTL, and every statement works
//     through a transaction pooler.
//   - Extend and release are owner-checked statements (lock_name, owner
//     and token, the lease not expired); they tell "the lease is gone"
//     (lock.ErrNotHeld) from "someone else holds it" (lock.ErrOwnedByOther).
//     Release keeps the row and its token (owner NULL, expired), so tokens
//     keep rising, and sends pg_notify on Channel with the lock name.
//   - A waiter LISTENs on Channel on a connection of its own and tries
//     again when a release is announced, so a graceful handover takes
//     milliseconds; it also retries every RetryInterval plus jitter. With
//     WithoutListen (behind postgres.pooler: transaction, where LISTEN is
//     not kept) it polls at RetryInterval only.
//   - A held lease renews itself every RenewInterval (TTL/3) and exposes a
//     Context cancelled with cause lock.ErrLost the moment a renewal finds
//     the lease gone or another's, or when the local trust deadline passes
//     (start of the last successful renewal + TTL − drift − safety margin,
//     on this process' monotonic clock): a holder cut off from Postgres
//     stops before its lease can expire there.
//
// Table names are qualified with the schema given by WithSchema, so the
// lease needs no search_path on its sessions. Like every lease, it cannot
// stop a paused holder; the fence in Postgres (outbox_fence) refuses one.
package pglease
