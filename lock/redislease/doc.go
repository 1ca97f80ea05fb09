// Package redislease is the Redis lease: a lock.Lease with fencing tokens
// over one Redis deployment or, in Redlock mode, several independent nodes.
//
// What it guarantees, beside what lock.Lease promises:
//
//   - Acquire is one Lua script per node: SET key owner NX PX ttl and, only when
//     that set the key, advance the fence counter beside it (fence:{key}, same
//     hash slot) and return it as the fencing token. The owner is a fresh UUID
//     per acquisition, and the lock key's value is the owner alone. Who holds
//     it for operators (lock.Options.Instance) goes to a holder record beside it
//     (holder:{key}, same slot, a hash {owner, instance}), written in the same
//     script and believed only while its owner is the lock key's value.
//   - Tokens per lock strictly increase, even after Redis loses its data
//     (restart without persistence, FLUSHALL, failover), provided the caller
//     passes lock.Options.Floor = the highest token its downstream store accepted:
//     the script returns max(counter+1, floor+1) and stores it.
//   - Release and extend are owner-checked scripts; they tell "the key is gone"
//     (lock.ErrNotHeld) apart from "someone else owns it" (lock.ErrOwnedByOther).
//   - A held lock renews itself every RenewInterval (TTL/3) and exposes a
//     Context that is cancelled, with cause lock.ErrLost, the moment a renewal finds
//     the key gone or owned by another, or when the local trust deadline passes
//     (start of the last successful renewal + TTL − drift − safety margin). The
//     deadline runs on this process' monotonic clock, so a holder that cannot
//     reach Redis stops before its lease can expire there.
//   - A waiter wakes as soon as the holder releases (pub/sub), so a graceful
//     handover takes milliseconds, not a retry interval or a TTL.
//   - Corrupted state fails loudly, never as a phantom holder. Every script
//     first checks that the lock key is absent or a string (with an expiry,
//     for acquire) and the fence counter absent or a base-10 integer INCR can
//     advance (no sign, no decimals, below 2^63-1), and refuses before its
//     first write when not: Redis does not roll a script back. The caller gets
//     lock.ErrCorrupt (a *lock.CorruptError names the key, the node, what it holds and
//     the fix), which is neither "held elsewhere" nor an outage: it does not
//     match lock.ErrNotObtained, and Acquire stops waiting. Holder and LastToken
//     apply the same checks. A held lock whose key turns corrupt is lost.
//   - With several independent nodes (Redlock) a lock needs N/2+1 of them and is
//     valid for TTL − elapsed − drift; its token is the maximum over the quorum,
//     written back to the quorum's counters before it is handed out, so any later
//     majority issues a larger one. A node with corrupted state counts as a
//     failed node; Acquire ends early only when such nodes alone leave too few
//     for a quorum.
//
// What it does not guarantee is package lock's: a lease cannot stop a
// paused holder; only the fence in Postgres can refuse it.
package redislease
