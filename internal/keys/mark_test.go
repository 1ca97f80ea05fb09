package keys

import (
	"strings"
	"testing"
	"time"
)

// content is ContentOf the payload {"n": 1} and empty headers.
var content = ContentOf([]byte(`{"n": 1}`), []byte(`{}`))

func TestFingerprintNamesTheRow(t *testing.T) {
	at := time.Date(2026, 11, 24, 1, 2, 3, 456789000, time.UTC)
	fp := Fingerprint(at, "deal", "42", "deal.funded", content)
	if got := Fingerprint(at.In(time.FixedZone("x", 3600)), "deal", "42", "deal.funded", content); got != fp {
		t.Errorf("same row, other zone: %q, want %q", got, fp)
	}
	same := ContentOf([]byte(`{"n": 1}`), []byte(`{}`)) // a restored copy: the same text
	if got := Fingerprint(at, "deal", "42", "deal.funded", same); got != fp {
		t.Errorf("same row, its content read again: %q, want %q", got, fp)
	}
	for name, other := range map[string]string{
		"a microsecond later":         Fingerprint(at.Add(time.Microsecond), "deal", "42", "deal.funded", content),
		"other aggregate_id":          Fingerprint(at, "deal", "43", "deal.funded", content),
		"other event_type":            Fingerprint(at, "deal", "42", "deal.closed", content),
		"names shifted":               Fingerprint(at, "deal4", "2", "deal.funded", content),
		"other payload":               Fingerprint(at, "deal", "42", "deal.funded", ContentOf([]byte(`{"n": 2}`), []byte(`{}`))),
		"other headers":               Fingerprint(at, "deal", "42", "deal.funded", ContentOf([]byte(`{"n": 1}`), []byte(`{"traceparent": "00-abc"}`))),
		"payload and headers swapped": Fingerprint(at, "deal", "42", "deal.funded", ContentOf([]byte(`{}`), []byte(`{"n": 1}`))),
		"bytes moved across":          Fingerprint(at, "deal", "42", "deal.funded", ContentOf([]byte(`{"n": 1}{`), []byte(`}`))),
	} {
		if other == fp {
			t.Errorf("%s: same fingerprint %q", name, fp)
		}
	}
	if got, ok := MarkCreatedAt(Delivered(fp)); !ok || !got.Equal(at) {
		t.Errorf("MarkCreatedAt(%q) = %v, %v; want %v", Delivered(fp), got, ok, at)
	}
	before := time.Date(1960, 1, 1, 0, 0, 0, 1000, time.UTC) // negative micros
	if got, ok := MarkCreatedAt(Delivered(Fingerprint(before, "a", "b", "c", Content{}))); !ok || !got.Equal(before) {
		t.Errorf("before 1970: MarkCreatedAt = %v, %v; want %v", got, ok, before)
	}
	for _, v := range []string{"1", "claim:3:x:y", "", "1:", "1:zz!"} {
		if _, ok := MarkCreatedAt(v); ok {
			t.Errorf("MarkCreatedAt(%q) ok", v)
		}
	}
}

func TestJudge(t *testing.T) {
	now := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	created := now.Add(-time.Hour)
	fp := Fingerprint(created, "deal", "42", "deal.funded", content)
	// age: how long before now a bare "1" was written with the 24 h TTL.
	bare := func(age time.Duration) time.Duration { return DeliveredTTL - age }
	cases := []struct {
		name  string
		found string
		pttl  time.Duration
		want  Verdict
	}{
		{"our mark", Delivered(fp), -1, ThisRow},
		{"a mark of an earlier row with the id", Delivered(Fingerprint(created.Add(-time.Minute), "deal", "42", "deal.funded", content)), bare(0), OtherRow},
		{"a mark of another aggregate with the id", Delivered(Fingerprint(created, "deal", "7", "deal.funded", content)), bare(0), OtherRow},
		{"a mark of a row with the id, created_at and names, another payload", Delivered(Fingerprint(created, "deal", "42", "deal.funded", ContentOf([]byte(`{"n": 2}`), []byte(`{}`)))), bare(0), OtherRow},
		{"a mark of the earlier format with this row's created_at and names", "1:" + fp[:strings.LastIndexByte(fp, '.')], bare(0), Unnamed},
		{"a mark of the earlier format of another row", "1:" + strings.Repeat("0", 10) + "." + fp[strings.IndexByte(fp, '.')+1:strings.LastIndexByte(fp, '.')], bare(0), OtherRow},
		{"empty fingerprint", "1:", bare(0), OtherRow},
		{"legacy 1 written after the row", "1", bare(30 * time.Minute), ThisRow},
		{"legacy 1 written within the skew before the row", "1", bare(time.Hour + LegacySkew - time.Millisecond), ThisRow},
		{"legacy 1 written before the row", "1", bare(time.Hour + LegacySkew + time.Second), OtherRow},
		{"legacy 1 without a TTL", "1", -1, OtherRow},
		{"legacy 1, key gone", "1", -2, OtherRow},
		{"a claim", "claim:3:owner:batch", bare(0), NotAMark},
		{"something else", "garbage", bare(0), NotAMark},
		{"absent", "", -2, NotAMark},
		{"11 is not a mark", "11", bare(0), NotAMark},
	}
	for _, c := range cases {
		if got := Judge(c.found, c.pttl, fp, created, now); got != c.want {
			t.Errorf("%s: Judge(%q, %s) = %s, want %s", c.name, c.found, c.pttl, got, c.want)
		}
	}
	// A row older than DeliveredTTL: read as if written with the TTL, a bare
	// "1" without one would date from after the row, yet nothing of
	// outboxd's left it; only one still counting down its TTL is the row's.
	old := now.Add(-DeliveredTTL - time.Hour)
	oldFP := Fingerprint(old, "deal", "42", "deal.funded", Content{})
	for _, c := range []struct {
		name string
		pttl time.Duration
		want Verdict
	}{
		{"legacy 1 without a TTL on a row older than the TTL", -1, OtherRow},
		{"legacy 1, key gone, on a row older than the TTL", -2, OtherRow},
		{"legacy 1 with its TTL on a row older than the TTL", bare(time.Hour), ThisRow},
	} {
		if got := Judge(LegacyDelivered, c.pttl, oldFP, old, now); got != c.want {
			t.Errorf("%s: Judge(%q, %s) = %s, want %s", c.name, LegacyDelivered, c.pttl, got, c.want)
		}
	}
}

// Judge and MarkCreatedAt are total over whatever a key may hold, and a
// row's own mark is always this row's, whatever its values.
func FuzzJudge(f *testing.F) {
	f.Add("1", int64(time.Hour), int64(1_700_000_000_000_000), "deal", "42", "deal.funded")
	f.Add("1:", int64(-1), int64(-1), "", "", "")
	f.Add("1:zz.zz", int64(-2), int64(0), "a\x00b", "c", "d")
	f.Add("claim:1:o:b", int64(0), int64(-62135596800000000), "x", "y", "z")
	f.Fuzz(func(t *testing.T, found string, pttl, createdUS int64, typ, agg, ev string) {
		created := time.UnixMicro(createdUS)
		fp := Fingerprint(created, typ, agg, ev, ContentOf([]byte(found), []byte(ev)))
		now := time.Now()
		_ = Judge(found, time.Duration(pttl), fp, created, now)
		_, _ = MarkCreatedAt(found)
		if v := Judge(Delivered(fp), time.Duration(pttl), fp, created, now); v != ThisRow {
			t.Fatalf("own mark %q judged %s", Delivered(fp), v)
		}
		if at, ok := MarkCreatedAt(Delivered(fp)); !ok || at.UnixMicro() != createdUS {
			t.Fatalf("MarkCreatedAt(%q) = %v, %v; want %d µs", Delivered(fp), at, ok, createdUS)
		}
	})
}

// The fingerprint is part of every delivered mark in Redis and of every
// deduplication id a broker holds: a relay that computed it otherwise would
// take its own marks for other rows' and send those rows again. The first
// two parts are the earlier format's (hash/fnv, fmt), so Judge can tell
// such a mark of this row (Unnamed) from another row's; the content part is
// SHA-256 as computed here by another implementation (Python's hashlib:
// sha256(sha256(p) + sha256(h)).hexdigest()[:16]).
func TestFingerprintStaysAsWritten(t *testing.T) {
	for _, c := range []struct {
		at              time.Time
		t, a, e         string
		payload, header string
		want            string
	}{
		{time.Date(2026, 11, 24, 15, 4, 5, 123456789, time.UTC), "deal", "42", "deal.funded", `{"n": 1}`, `{}`, "hogob5ml4w.e345fcd3.c73436916fc1b368"},
		{time.Unix(0, 0), "", "", "", "", "", "0.4ab0f7b7.2dba5dbc339e7316"},
		{time.Date(1960, 1, 1, 0, 0, 0, 0, time.UTC), "ü", "x\x00y", "z", `{"ü": "x\u0000y"}`, `{"traceparent": "00-abc"}`, "-33vlgimtc0.fd07f225.c56986133a7e5cc4"},
	} {
		content := ContentOf([]byte(c.payload), []byte(c.header))
		if got := Fingerprint(c.at, c.t, c.a, c.e, content); got != c.want {
			t.Errorf("Fingerprint(%v, %q, %q, %q, %s/%s) = %q, want %q", c.at, c.t, c.a, c.e, c.payload, c.header, got, c.want)
		}
		if got, want := Mark(c.at, c.t, c.a, c.e, content), Delivered(c.want); got != want {
			t.Errorf("Mark(%v, %q, %q, %q) = %q, want %q", c.at, c.t, c.a, c.e, got, want)
		}
		if got := MarkFingerprint(Delivered(c.want)); got != c.want {
			t.Errorf("MarkFingerprint(%q) = %q, want %q", Delivered(c.want), got, c.want)
		}
	}
}

// The poller names a delivered mark and a key per event: one allocation
// each (the string), not five.
func TestPerEventNamesAllocateOnce(t *testing.T) {
	at := time.Date(2026, 11, 24, 15, 4, 5, 123456789, time.UTC)
	space := New("bb:1764000000000000000:")
	for name, f := range map[string]func(){
		"Fingerprint": func() { _ = Fingerprint(at, "deal", "42", "deal.funded", content) },
		"Mark":        func() { _ = Mark(at, "deal", "42", "deal.funded", content) },
		"Idempotency": func() { _ = space.Idempotency(1234567890) },
	} {
		if n := testing.AllocsPerRun(100, f); n > 1 {
			t.Errorf("%s: %.0f allocations, want 1", name, n)
		}
	}
	payload, headers := []byte(`{"n": 1, "s": "`+strings.Repeat("x", 4000)+`"}`), []byte(`{"traceparent": "00-abc"}`)
	if n := testing.AllocsPerRun(100, func() { _ = ContentOf(payload, headers) }); n != 0 {
		t.Errorf("ContentOf: %.0f allocations, want none", n)
	}
	if got, want := space.Idempotency(1234567), "bb:1764000000000000000:idempotency:notify:1234567"; got != want {
		t.Errorf("Idempotency = %q, want %q", got, want)
	}
	if got, want := New("").Idempotency(-5), "idempotency:notify:-5"; got != want {
		t.Errorf("Idempotency = %q, want %q", got, want)
	}
}

// The forms that append to a caller's buffer, and ContentWith over a
// headers digest taken once, name exactly what the one-row forms name.
func TestAppendFormsNameTheSame(t *testing.T) {
	at := time.Date(2026, 11, 24, 15, 4, 5, 123456789, time.UTC)
	space := New("bb:1:")
	payload, headers := []byte(`{"n": 1}`), []byte(`{"traceparent": "00-abc"}`)
	if got, want := ContentWith(payload, HeadersDigest(headers)), ContentOf(payload, headers); got != want {
		t.Errorf("ContentWith = %x, want ContentOf's %x", got, want)
	}
	b := []byte("before|")
	b = AppendMark(b, at, "deal", "42", "deal.funded", content)
	b = space.AppendIdempotency(append(b, '|'), 1234567)
	if got, want := string(b), "before|"+Mark(at, "deal", "42", "deal.funded", content)+"|"+space.Idempotency(1234567); got != want {
		t.Errorf("appended %q, want %q", got, want)
	}
}
