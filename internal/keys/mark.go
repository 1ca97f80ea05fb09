package keys

import (
	"crypto/sha256"
	"strconv"
	"strings"
	"time"
)

// The delivered mark: what an idempotency key holds once its row was sent.
//
// Guarantee: a mark names one row, not one id. It is "1:<fingerprint>",
// the fingerprint taken from what the row was created with (Fingerprint):
// its created_at, its three names, its payload and its headers, so a key
// left by an earlier row that had the same id is recognised as foreign and
// never taken for "delivered". The poller and reconciliation's repair
// sweep both decide with Judge; brokers that deduplicate are given the
// same fingerprint (dispatch.Event.Fingerprint). When ids come round
// again, and the edges (each toward a duplicate, never a loss):
// docs/design.md, "Idempotency keys".

// DeliveredTTL is how long a key says "delivered".
const DeliveredTTL = 24 * time.Hour

// LegacyDelivered is the bare mark earlier versions wrote: it names the id
// alone. It is read during the upgrade window (see Judge) and never written.
const LegacyDelivered = "1"

// LegacySkew is how much earlier than its row's created_at a bare mark may
// seem to have been written and still be taken as this row's: the clocks
// of the relay and of Postgres may differ by this much.
const LegacySkew = 5 * time.Second

// Content is the digest of a row's payload and headers: the first 8 bytes
// of SHA-256(SHA-256(payload) || SHA-256(headers)), each taken over the
// JSON text Postgres renders for the jsonb value (what a read of the
// column returns, binary or text; a NULL is empty). The poller takes it
// with ContentOf from the bytes it loaded to send; store computes the same
// in SQL for the rows it does not load (store.Reconcile.ContentDigests). A
// digest of digests keeps the two parts apart without a copy of either.
type Content [8]byte

// ContentOf is the Content of a row whose payload and headers read as
// payload and headers. It allocates nothing.
func ContentOf(payload, headers []byte) Content {
	return ContentWith(payload, HeadersDigest(headers))
}

// HeadersDigest is the SHA-256 of a row's headers, the part of Content
// that rows written with the same headers share: a caller may take it
// once for them (ContentWith).
func HeadersDigest(headers []byte) [sha256.Size]byte { return sha256.Sum256(headers) }

// ContentWith is ContentOf(payload, headers) for the headers whose
// HeadersDigest is headers. It allocates nothing.
func ContentWith(payload []byte, headers [sha256.Size]byte) Content {
	var both [2 * sha256.Size]byte
	p := sha256.Sum256(payload)
	copy(both[:sha256.Size], p[:])
	copy(both[sha256.Size:], headers[:])
	sum := sha256.Sum256(both[:])
	return Content(sum[:len(Content{})])
}

// Fingerprint identifies a row beyond its id: its created_at in unix
// microseconds (Postgres' precision) in base 36, a dot, the FNV-1a 32-bit
// hash of aggregate_type, aggregate_id and event_type in hex, a dot, and
// content (the payload and headers, ContentOf) in hex. A restored copy of
// the same row keeps it; a new row that reuses the id gets another
// (created_at moves on; a row written again with its created_at and names
// set by hand differs in its payload or headers). At most 41 characters,
// all of them [0-9a-z.-]: a broker's deduplication id may carry it.
//
// It is built in one allocation (the string): the poller takes one per
// event, and hash/fnv, fmt and concatenation cost five.
func Fingerprint(createdAt time.Time, aggregateType, aggregateID, eventType string, content Content) string {
	var buf [48]byte // 14 base-36 digits and a sign at most, a dot, 8 hex digits, a dot, 16 hex digits
	return string(appendFingerprint(buf[:0], createdAt, aggregateType, aggregateID, eventType, content))
}

// Mark is Delivered(Fingerprint(...)) in one allocation: the poller makes
// one per event it claims; its fingerprint is Mark's text after "1:".
func Mark(createdAt time.Time, aggregateType, aggregateID, eventType string, content Content) string {
	var buf [48]byte
	b := append(buf[:0], LegacyDelivered+":"...)
	return string(appendFingerprint(b, createdAt, aggregateType, aggregateID, eventType, content))
}

// AppendMark appends Mark's text to b: a caller naming many rows at once
// may build their marks in one buffer.
func AppendMark(b []byte, createdAt time.Time, aggregateType, aggregateID, eventType string, content Content) []byte {
	b = append(b, LegacyDelivered+":"...)
	return appendFingerprint(b, createdAt, aggregateType, aggregateID, eventType, content)
}

// MarkFingerprint is the fingerprint a "1:<fingerprint>" mark names.
func MarkFingerprint(mark string) string {
	return strings.TrimPrefix(mark, LegacyDelivered+":")
}

// appendFingerprint appends Fingerprint's text to b.
func appendFingerprint(b []byte, createdAt time.Time, aggregateType, aggregateID, eventType string, content Content) []byte {
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
		b = append(b, hexDigits[h>>shift&0xf])
	}
	b = append(b, '.')
	for _, c := range content {
		b = append(b, hexDigits[c>>4], hexDigits[c&0xf])
	}
	return b
}

const hexDigits = "0123456789abcdef"

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
	Unnamed                 // a mark of the earlier format, which does not name the content: never trusted
)

func (v Verdict) String() string {
	switch v {
	case ThisRow:
		return "this row"
	case OtherRow:
		return "other row"
	case Unnamed:
		return "mark without content"
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
//
// A mark "1:<created_at>.<names>" (the format of earlier versions: no
// payload and headers digest) whose two parts are this row's is Unnamed,
// never this row's: it cannot tell this row from one written again with
// the same created_at and names and another payload, and trusting it could
// lose that row. Its row is sent again (a possible duplicate); such marks
// are left only on rows whose delivery was not yet written to Postgres
// when an earlier version stopped. One whose parts differ is OtherRow.
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
		got := found[len(LegacyDelivered)+1:]
		switch {
		case got == fp:
			return ThisRow
		case strings.Count(got, ".") == 1 && strings.HasPrefix(fp, got+"."):
			return Unnamed
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
