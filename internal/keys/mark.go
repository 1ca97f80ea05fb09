package keys

import (
	"strconv"
	"strings"
	"time"
)

// The delivered mark: what an idempotency key holds once its row was sent.
//
// Guarantee: a mark names one row, not one id. It is "1:<fingerprint>",
// the fingerprint taken from what the row was created with (Fingerprint),
// so a key left by an earlier row that had the same id (the ids came round
// again: TRUNCATE ... RESTART IDENTITY, a sequence restart, a database
// re-created under the same redis.key_prefix, a restored backup or a
// failover to a replica that lost the newest rows) is recognised as
// foreign and never taken for "delivered". The poller and reconciliation's
// repair sweep both decide with Judge.
//
// Edges: an operator who rewrites a row's created_at, aggregate_type,
// aggregate_id or event_type by hand after its delivery gets it sent again
// (a duplicate, never a loss). Two rows with the same id, the same
// created_at to the microsecond and the same three names (a copy of the same
// row) count as one.

// DeliveredTTL is how long a key says "delivered".
const DeliveredTTL = 24 * time.Hour

// LegacyDelivered is the bare mark earlier versions wrote: it names the id
// alone. It is read during the upgrade window (see Judge) and never written.
const LegacyDelivered = "1"

// LegacySkew is how much earlier than its row's created_at a bare mark may
// seem to have been written and still be taken as this row's: the clocks
// of the relay and of Postgres may differ by this much.
const LegacySkew = 5 * time.Second

// Fingerprint identifies a row beyond its id: its created_at in unix
// microseconds (Postgres' precision) in base 36, a dot, and the FNV-1a
// 32-bit hash of aggregate_type, aggregate_id and event_type, in hex. A
// restored copy of the same row keeps it; a new row that reuses the id gets
// another (created_at moves on; rows that set created_at by hand usually
// differ in their names).
//
// It is built in one allocation (the string): the poller takes one per
// event, and hash/fnv, fmt and concatenation cost five.
func Fingerprint(createdAt time.Time, aggregateType, aggregateID, eventType string) string {
	var buf [32]byte // 14 base-36 digits and a sign at most, a dot, 8 hex digits
	return string(appendFingerprint(buf[:0], createdAt, aggregateType, aggregateID, eventType))
}

// Mark is Delivered(Fingerprint(...)) in one allocation: the poller makes
// one per event it claims; its fingerprint is Mark's text after "1:".
func Mark(createdAt time.Time, aggregateType, aggregateID, eventType string) string {
	var buf [40]byte
	b := append(buf[:0], LegacyDelivered+":"...)
	return string(appendFingerprint(b, createdAt, aggregateType, aggregateID, eventType))
}

// MarkFingerprint is the fingerprint a "1:<fingerprint>" mark names.
func MarkFingerprint(mark string) string {
	return strings.TrimPrefix(mark, LegacyDelivered+":")
}

// appendFingerprint appends Fingerprint's text to b.
func appendFingerprint(b []byte, createdAt time.Time, aggregateType, aggregateID, eventType string) []byte {
	h := uint32(fnvOffset32)
	for _, s := range [...]string{aggregateType, aggregateID, eventType} {
		for i := 0; i < len(s); i++ {
			h = (h ^ uint32(s[i])) * fnvPrime32
		}
		h *= fnvPrime32 // the 0 byte after each name: h ^ 0 == h
	}
	b = strconv.AppendInt(b, createdAt.UnixMicro(), 36)
	b = append(b, '.')
	for shift := 28; shift >= 0; shift -= 4 {
		b = append(b, "0123456789abcdef"[h>>shift&0xf])
	}
	return b
}

// FNV-1a, 32 bits (hash/fnv's New32a, without its allocations).
const (
	fnvOffset32 = 2166136261
	fnvPrime32  = 16777619
)

// Delivered is the mark for the row with fingerprint fp: "1:<fp>".
func Delivered(fp string) string { return LegacyDelivered + ":" + fp }

// Verdict is what a value found on a row's idempotency key says about that row.
type Verdict uint8

const (
	NotAMark Verdict = iota // no delivered mark: absent, a claim, or anything else
	ThisRow                 // this row's mark: the row was delivered
	OtherRow                // a mark left by another row with the same id: never trusted
)

func (v Verdict) String() string {
	switch v {
	case ThisRow:
		return "this row"
	case OtherRow:
		return "other row"
	default:
		return "not a mark"
	}
}

// Judge reads the value found on the key of the row with fingerprint fp
// created at createdAt. pttl is the key's remaining life as Redis reported
// it (PTTL: -1 for none, -2 for no key); it matters only for a bare "1".
//
// A bare "1" (written by versions before the mark named its row) is this
// row's only if it could have been written after the row was created: its
// write time is now - (DeliveredTTL - pttl), since it was set with the 24 h
// TTL, and it must not be earlier than createdAt - LegacySkew. One without
// a TTL was not written by outboxd and is not trusted. Bare marks expire
// within DeliveredTTL of the last write by an earlier version: that is the
// upgrade window.
func Judge(found string, pttl time.Duration, fp string, createdAt, now time.Time) Verdict {
	switch {
	case found == LegacyDelivered:
		if pttl < 0 {
			return OtherRow
		}
		written := now.Add(pttl - DeliveredTTL)
		if written.Before(createdAt.Add(-LegacySkew)) {
			return OtherRow
		}
		return ThisRow
	case strings.HasPrefix(found, LegacyDelivered+":"):
		if found[len(LegacyDelivered)+1:] == fp {
			return ThisRow
		}
		return OtherRow
	default:
		return NotAMark
	}
}

// MarkCreatedAt reads the created_at a "1:<fingerprint>" mark was made for
// (for logs); ok is false for anything else.
func MarkCreatedAt(v string) (t time.Time, ok bool) {
	fp, found := strings.CutPrefix(v, LegacyDelivered+":")
	if !found {
		return t, false
	}
	us, _, _ := strings.Cut(fp, ".")
	n, err := strconv.ParseInt(us, 36, 64)
	if err != nil {
		return t, false
	}
	return time.UnixMicro(n).UTC(), true
}
