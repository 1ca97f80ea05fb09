// Package keys names the Redis keys and locks outboxd uses (docs/reference.md,
// "Redis keys" table), so each is spelled in one place.
//
// The lock package shapes the keys of a lock itself (the lock key, its
// fence counter fence:{<lock key>} in the same hash slot, and the release
// channel <lock key>:released), because that shape carries its guarantees;
// it applies the same prefix, given once in app from redis.key_prefix.
package keys

import "strconv"

// Lock names (without the prefix).
const (
	PollerLock    = "lock:outbox:poller"
	ReconcileLock = "lock:reconciliation"
)

// Locks lists every lock outboxd takes, for status and metrics.
var Locks = []string{PollerLock, ReconcileLock}

// Space applies one deployment's key prefix (redis.key_prefix).
type Space struct{ prefix string }

// New returns the key space for prefix ("" for none).
func New(prefix string) Space { return Space{prefix: prefix} }

// Idempotency is idempotency:notify:<outbox id>: the row's delivered mark
// "1:<fingerprint>" once delivered (see Delivered, Judge), a claim while a
// delivery is in flight.
//
// One allocation (the string): the poller names two keys per event.
func (s Space) Idempotency(id int64) string {
	const name = "idempotency:notify:"
	var buf [96]byte // room for a usual prefix, the name and 20 digits; a longer prefix grows it
	b := append(append(buf[:0], s.prefix...), name...)
	return string(strconv.AppendInt(b, id, 10))
}

// AppendIdempotency appends Idempotency(id)'s text to b: a caller naming
// many keys at once may build them in one buffer.
func (s Space) AppendIdempotency(b []byte, id int64) []byte {
	b = append(append(b, s.prefix...), "idempotency:notify:"...)
	return strconv.AppendInt(b, id, 10)
}

// Circuit is circuit:<destination>: the state of the destination's open
// circuit breaker as the leader last wrote it (JSON), absent while closed.
func (s Space) Circuit(destination string) string { return s.prefix + "circuit:" + destination }

// Reserved are the key prefixes of everything outboxd keeps in Redis under
// this prefix: locks, their fence counters, the idempotency keys and the
// circuit states. No
// destination rendered from a row may name one (a redis_stream sink's
// stream key); the lock package shapes fence:{<lock>} itself.
func (s Space) Reserved() []string {
	return []string{s.prefix + "lock:", s.prefix + "fence:", s.prefix + "idempotency:", s.prefix + "circuit:"}
}
