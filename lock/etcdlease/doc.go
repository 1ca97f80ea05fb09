// Package etcdlease is the etcd lease: a lock.Lease with fencing tokens on
// an etcd v3 cluster, linearizable through etcd's Raft log.
//
// What it guarantees, beside what lock.Lease promises:
//
//   - Acquire grants an etcd lease of the lock's TTL (whole seconds, rounded
//     up) and takes the lock key in one transaction: it succeeds only when
//     the key does not exist (create revision 0) and the fence key is as the
//     attempt read it. The key carries the etcd lease and holds the
//     holder's lock.Options.Instance; the owner is the etcd lease's ID, so a
//     key that outlives its lease (or was put by anyone else) is another's.
//   - The token is max(revision read + 1, fence + 1, floor + 1), written to
//     the fence key in the same transaction: strictly increasing per lock,
//     derived from etcd's revision, and above lock.Options.Floor also when
//     etcd lost its data (restored from a snapshot, a fresh data dir) or the
//     leases lived elsewhere before. Recovered says the floor lifted it.
//   - A held lock renews itself every RenewInterval (TTL/3): one keep-alive
//     of its etcd lease, then a read of the key that checks it is still on
//     that lease. A lease etcd no longer has (lock.ErrNotHeld), a key gone
//     (lock.ErrNotHeld) or on another lease (lock.ErrOwnedByOther) loses the
//     lock at once; an unreachable etcd loses it at the local trust deadline
//     (start of the last successful renewal + TTL − drift − safety margin),
//     before etcd can expire the lease.
//   - A waiter watches the lock key and tries again the moment it is
//     deleted, so a graceful handover takes one round trip.
//   - Release deletes the key only while it is still on this lock's lease
//     (owner-checked, one transaction) and then revokes the lease.
//   - A fence key that holds no integer is corrupted state: lock.ErrCorrupt
//     names it, and Acquire stops waiting.
//
// What it does not guarantee is package lock's: a lease cannot stop a
// paused holder; only the fence in Postgres can refuse it. etcd grants a
// lease no shorter than its own minimum (1.5 election timeouts), so TTLs
// below that last as long as that minimum there.
package etcdlease
