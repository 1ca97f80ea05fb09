package webhook

import (
	"bufio"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// ErrReservedHeader: a static webhook header names one of the headers the
// webhook sets itself (the contract's, or the transport's).
var ErrReservedHeader = errors.New("reserved: outboxd sets this header itself")

// reservedHeaders are set by the webhook on every request (or by the HTTP
// transport): a static header cannot replace them. webhook-* and ce-* are
// reserved as prefixes.
var reservedHeaders = map[string]bool{
	"Content-Type": true, "Idempotency-Key": true, "X-Fencing-Token": true, "User-Agent": true,
	"Traceparent": true, "Tracestate": true, ResentFromHeader: true,
	"Host": true, "Content-Length": true, "Transfer-Encoding": true, "Connection": true,
}

// Bounds of the static webhook headers: how many, and how long one may be
// (name and value; receivers commonly refuse a header line above 8 KiB).
const (
	MaxStaticHeaders     = 100
	MaxStaticHeaderBytes = 8 << 10
)

// CheckStaticHeader checks one static request header: a valid field name
// that is not reserved, and a value on one line, together at most
// MaxStaticHeaderBytes. Its errors never quote the value, which may be a
// secret.
func CheckStaticHeader(name, value string) error {
	if len(name)+len(value) > MaxStaticHeaderBytes {
		return fmt.Errorf("dispatch: webhook header: name and value hold %d bytes, want at most %d", len(name)+len(value), MaxStaticHeaderBytes)
	}
	if !validFieldName(name) {
		return fmt.Errorf("dispatch: webhook header %q: not a valid header name", name)
	}
	canon := http.CanonicalHeaderKey(name)
	lower := strings.ToLower(canon)
	if reservedHeaders[canon] || strings.HasPrefix(lower, "webhook-") || strings.HasPrefix(lower, "ce-") {
		return fmt.Errorf("dispatch: webhook header %s: %w", canon, ErrReservedHeader)
	}
	for i := range len(value) {
		if c := value[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return fmt.Errorf("dispatch: webhook header %s: the value holds a control character (a line break?)", canon)
		}
	}
	return nil
}

// validFieldName: an HTTP token (RFC 9110 §5.6.2).
func validFieldName(s string) bool {
	if s == "" {
		return false
	}
	for i := range len(s) {
		c := s[i]
		if c >= 0x7f || c <= ' ' || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// ParseHeaderLines reads static headers written one per line as
// "Name: value" (dispatch.webhook.headers_file), at most MaxStaticHeaders;
// blank lines and lines starting with # are skipped. Errors name the line,
// never its value.
func ParseHeaderLines(s string) (map[string]string, error) {
	out := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(s))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, value, ok := strings.Cut(line, ":")
		if !ok {
			return nil, fmt.Errorf("line %d: want Name: value", n)
		}
		name, value = strings.TrimSpace(name), strings.TrimSpace(value)
		if err := CheckStaticHeader(name, value); err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		canon := http.CanonicalHeaderKey(name)
		if _, dup := out[canon]; dup {
			return nil, fmt.Errorf("line %d: header %s given twice", n, canon)
		}
		if len(out) == MaxStaticHeaders {
			return nil, fmt.Errorf("line %d: more than %d headers", n, MaxStaticHeaders)
		}
		out[canon] = value
	}
	return out, sc.Err()
}

// staticHeaders checks headers and returns them canonical.
func staticHeaders(headers map[string]string) (http.Header, error) {
	if len(headers) > MaxStaticHeaders {
		return nil, fmt.Errorf("dispatch: %d static webhook headers, want at most %d", len(headers), MaxStaticHeaders)
	}
	h := http.Header{}
	for name, value := range headers {
		if err := CheckStaticHeader(name, value); err != nil {
			return nil, err
		}
		h.Set(name, value)
	}
	return h, nil
}

// ParseSigningKey decodes a Standard Webhooks asymmetric signing key:
// "whsk_" and the base64 of an ed25519 private key, its 32-byte seed or
// the 64-byte key (seed and public key). "" means no asymmetric signing.
// Its errors never quote the key.
func ParseSigningKey(s string) (ed25519.PrivateKey, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	rest, ok := strings.CutPrefix(s, "whsk_")
	if !ok {
		return nil, errors.New("dispatch: webhook signing key: want whsk_ followed by the base64 of an ed25519 key")
	}
	b, err := base64.StdEncoding.DecodeString(rest)
	if err != nil {
		return nil, fmt.Errorf("dispatch: webhook signing key: the part after whsk_ is not valid base64 (%w)", err)
	}
	switch len(b) {
	case ed25519.SeedSize:
		return ed25519.NewKeyFromSeed(b), nil
	case ed25519.PrivateKeySize:
		k := ed25519.NewKeyFromSeed(b[:ed25519.SeedSize])
		if !k.Equal(ed25519.PrivateKey(b)) {
			return nil, errors.New("dispatch: webhook signing key: the 64-byte key's public half does not belong to its seed")
		}
		return k, nil
	default:
		return nil, fmt.Errorf("dispatch: webhook signing key: %d bytes after decoding, want %d (seed) or %d (private key)", len(b), ed25519.SeedSize, ed25519.PrivateKeySize)
	}
}

// SignAsymmetric returns the Standard Webhooks asymmetric signature:
// "v1a," and the base64 ed25519 signature of "id.timestamp.body".
func SignAsymmetric(key ed25519.PrivateKey, id string, ts int64, body []byte) string {
	msg := make([]byte, 0, len(id)+len(body)+22)
	msg = append(msg, id...)
	msg = append(msg, '.')
	msg = strconv.AppendInt(msg, ts, 10)
	msg = append(msg, '.')
	msg = append(msg, body...)
	return "v1a," + base64.StdEncoding.EncodeToString(ed25519.Sign(key, msg))
}
