// Package webhook is the HTTP sink: one POST per event to a configured
// URL, the contract's JSON envelope as the body (or a CloudEvent), signed
// the Standard Webhooks way (v1 HMAC, v1a ed25519), with the contract's
// headers (Idempotency-Key, X-Fencing-Token, webhook-*), static headers,
// TLS and a client certificate for an https receiver. It imports nothing
// of outboxd but dispatch.
//
// What it promises: an event is Delivered only on a 2xx answer to its own
// request; an aggregate's requests go one after another, each after the
// previous one's 2xx (dispatch.PerEvent); no request's bytes reach the
// socket once the batch's trust deadline has passed (deadlineconn.go);
// redirects are never followed.
// How each answer is classified is on Sink.
package webhook

import (
	"bytes"
	"cmp"
	"context"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/outboxd/outboxd/dispatch"
)

// Config configures the webhook sink.
type Config struct {
	URL     string
	Secret  string        // Standard Webhooks signing: one secret or several (rotation; ParseSecrets), the current first
	Timeout time.Duration // per request; DefaultTimeout when 0
	Client  *http.Client  // optional; default a keep-alive client with Concurrency connections
	Log     *slog.Logger  // optional; warns about event headers that were dropped
	// Concurrency is how many aggregates are sent at once (poller.concurrency);
	// dispatch.DefaultConcurrency when 0.
	Concurrency int
	// CloudEvents adds ce- request headers (binary mode; the body stays the
	// contract's JSON envelope), or sends the event as
	// application/cloudevents+json (structured mode; data = the payload).
	CloudEvents dispatch.CloudEvents
	// Headers are static request headers (an API key, a tenant): each
	// request carries them; a header of the webhook's own is refused
	// (CheckStaticHeader).
	Headers map[string]string
	// SigningKey adds a Standard Webhooks asymmetric signature (v1a,
	// ed25519; ParseSigningKey) beside any v1 HMAC signatures.
	SigningKey string
	// TLS configures the connection to an https receiver (a custom CA, a
	// client certificate); nil: the system roots, no client certificate.
	// Ignored with Client.
	TLS *tls.Config
	// UserAgent is every request's User-Agent; DefaultUserAgent when "".
	UserAgent string
}

// DefaultUserAgent is the User-Agent when Config.UserAgent is "".
const DefaultUserAgent = "outboxd"

// MaxRetryAfter caps a receiver's Retry-After, so an absurd value cannot
// overflow a duration; callers clamp further to their own backoff ceiling.
const MaxRetryAfter = 7 * 24 * time.Hour

// Sink POSTs each event as JSON. 2xx is delivered; 408, 425, 429, 5xx,
// timeouts and connection errors are retryable, and so are the answers about
// the destination (destinationAnswer: 401, 403, 404, 405, 407, 431); other
// statuses are permanent.
//
// An interim answer other than 100 Continue and 103 Early Hints, or a
// protocol switch (101), is a failed, retryable attempt: the connection is
// closed at once, never read or held.
//
// Redirects are never followed: the signed body and the fencing token go to
// the configured URL only. A 301 or 308 (moved for good) is permanent, any
// other 3xx is retryable.
//
// A request whose context deadline passes before its bytes reach the socket
// is never written (dispatch.ErrDeadlinePassed), even if the sender was frozen
// between deciding to send and writing.
//
// Error texts name the target as scheme://host/path only: the URL's
// credentials and query (tokens) never reach logs or last_error.
type Sink struct {
	dispatch.Sink // dispatch.PerEvent over SendEvent
	url           string
	target        string // the URL without userinfo and query, for error texts
	secret        [][]byte
	sigKey        ed25519.PrivateKey // v1a signing; nil: none
	static        http.Header        // static headers (Config.Headers)
	agent         string
	client        *http.Client
	log           *slog.Logger
	ce            dispatch.CloudEvents
	now           func() time.Time
}

// DefaultTimeout bounds one request when Config.Timeout is 0.
const DefaultTimeout = 10 * time.Second

// New validates cfg (ParseURL, ParseSecrets) and returns the sink.
func New(cfg Config) (*Sink, error) {
	u, err := ParseURL(cfg.URL)
	if err != nil {
		return nil, err
	}
	secrets, err := ParseSecrets(cfg.Secret)
	if err != nil {
		return nil, err
	}
	sigKey, err := ParseSigningKey(cfg.SigningKey)
	if err != nil {
		return nil, err
	}
	static, err := staticHeaders(cfg.Headers)
	if err != nil {
		return nil, err
	}
	var client http.Client
	if cfg.Client != nil {
		client = *cfg.Client
	} else {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		// One connection per aggregate being sent, kept alive between its
		// events: fewer idle ones than that would close and reopen
		// connections at every event; more would only hold file descriptors.
		conns := cmp.Or(cfg.Concurrency, dispatch.DefaultConcurrency)
		tr.MaxIdleConns, tr.MaxIdleConnsPerHost, tr.MaxConnsPerHost = conns, conns, conns
		tr.ForceAttemptHTTP2 = false // one request per connection: the write deadline is per request
		if cfg.TLS != nil {
			tr.TLSClientConfig = cfg.TLS.Clone()
		}
		tr.DialContext = dialDeadlineConns((&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext)
		client.Transport = tr
	}
	client.Timeout = cmp.Or(cfg.Timeout, DefaultTimeout)
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	w := &Sink{url: cfg.URL, target: displayURL(u), secret: secrets, sigKey: sigKey, static: static,
		agent: cmp.Or(cfg.UserAgent, DefaultUserAgent), client: &client, log: log, ce: cfg.CloudEvents, now: time.Now}
	w.Sink = dispatch.PerEvent(w.SendEvent, cfg.Concurrency, dispatch.Capabilities{
		Ordering: "per aggregate: its requests one after another, each after the previous one's 2xx",
	})
	return w, nil
}

// ParseURL checks a webhook URL: absolute http or https with a host. Its
// errors never quote the URL, which may hold credentials.
func ParseURL(s string) (*url.URL, error) {
	if s == "" {
		return nil, errors.New("dispatch: webhook url is empty")
	}
	u, err := url.Parse(s)
	if err != nil {
		return nil, errors.New("dispatch: webhook url cannot be parsed as a URL (percent-encode reserved characters in a user name or password)")
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("dispatch: webhook url: want an absolute http(s) URL, got scheme %q and host %q", u.Scheme, u.Hostname())
	}
	return u, nil
}

// displayURL is u without userinfo, query and fragment.
func displayURL(u *url.URL) string {
	return (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}).String()
}

// ParseSecret decodes a signing secret: a Standard Webhooks "whsec_<base64>"
// secret, or any other string used as raw bytes ("" disables signing).
func ParseSecret(s string) ([]byte, error) {
	rest, ok := strings.CutPrefix(s, "whsec_")
	if !ok {
		return []byte(s), nil
	}
	b, err := base64.StdEncoding.DecodeString(rest)
	if err != nil {
		return nil, fmt.Errorf("dispatch: webhook secret: the part after whsec_ is not valid base64 (%w); use the secret exactly as issued, or one without the whsec_ prefix to sign with its raw bytes", err)
	}
	if len(b) == 0 {
		return nil, errors.New("dispatch: webhook secret: whsec_ is followed by no key bytes; use the secret exactly as issued")
	}
	return b, nil
}

// ParseSecrets decodes the signing secrets of dispatch.webhook.secret:
// one per line (a YAML list arrives joined by newlines, a secret_file may
// hold one per line); a line of several whsec_ secrets separated by spaces
// or commas (an environment variable) is split. Any other line is one
// secret, taken whole: a raw secret may contain spaces or commas. Each is decoded by ParseSecret. "" means no signing.
func ParseSecrets(s string) ([][]byte, error) {
	var list []string
	for line := range strings.Lines(s) {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		parts := strings.FieldsFunc(line, func(r rune) bool { return r == ',' || unicode.IsSpace(r) })
		if len(parts) < 2 || !allPrefixed(parts, "whsec_") {
			parts = []string{line}
		}
		list = append(list, parts...)
	}
	out := make([][]byte, len(list))
	for i, p := range list {
		b, err := ParseSecret(p)
		if err != nil && len(list) > 1 {
			// Which one, by its place: never its text.
			err = fmt.Errorf("secret %d of %d: %w", i+1, len(list), err)
		}
		if err != nil {
			return nil, err
		}
		out[i] = b
	}
	return out, nil
}

func allPrefixed(ss []string, prefix string) bool {
	for _, s := range ss {
		if !strings.HasPrefix(s, prefix) {
			return false
		}
	}
	return true
}

// Signatures returns the webhook-signature header value: one "v1,<sig>"
// per secret, space-separated, in the secrets' order (Standard Webhooks:
// a receiver accepts the request if any one matches, so a secret can be
// rotated without downtime).
func Signatures(secrets [][]byte, id string, ts int64, body []byte) string {
	sigs := make([]string, len(secrets))
	for i, k := range secrets {
		sigs[i] = Sign(k, id, ts, body)
	}
	return strings.Join(sigs, " ")
}

// signatures is the webhook-signature header value: the v1 signatures,
// then the v1a one; "" when nothing signs.
func (w *Sink) signatures(id string, ts int64, body []byte) string {
	sigs := make([]string, 0, 2)
	if len(w.secret) > 0 {
		sigs = append(sigs, Signatures(w.secret, id, ts, body))
	}
	if w.sigKey != nil {
		sigs = append(sigs, SignAsymmetric(w.sigKey, id, ts, body))
	}
	return strings.Join(sigs, " ")
}

// Sign returns the Standard Webhooks signature header value for body.
func Sign(secret []byte, id string, ts int64, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	fmt.Fprintf(mac, "%s.%d.", id, ts)
	mac.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// SendEvent POSTs one event (the webhook's SendFunc).
func (w *Sink) SendEvent(ctx context.Context, ev dispatch.Event, token int64) error {
	body, contentType, err := w.body(ev)
	if err != nil {
		return &dispatch.Error{Err: fmt.Errorf("webhook: encode event %d: %w", ev.ID, err), Permanent: true}
	}
	actx, guard := armSend(ctx)
	defer guard.release()
	req, err := http.NewRequestWithContext(actx, http.MethodPost, w.url, bytes.NewReader(body))
	if err != nil {
		return &dispatch.Error{Err: fmt.Errorf("webhook: build request for %s: %w", w.target, err), Permanent: true}
	}
	fwd := readForwarded(ev.Headers)
	w.setHeaders(req.Header, ev, fwd, token, contentType, body)
	w.setTraceHeaders(req.Header, ev.ID, fwd)
	resp, err := w.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // its URL may carry credentials or tokens
		}
		// Written and no final status (a held socket, an interim answer): the
		// receiver's doing, whoever's deadline ended it.
		return &dispatch.Error{Err: fmt.Errorf("webhook: event %d: POST %s: %w", ev.ID, w.target, err), Unanswered: guard.unanswered()}
	}
	return w.readResponse(ev, resp)
}

// setHeaders sets the static headers, then the contract's: identity,
// idempotency key, fencing token, Standard Webhooks id, timestamp and
// signatures, the copied row of a resent copy, and CloudEvents attributes
// in binary mode.
func (w *Sink) setHeaders(h http.Header, ev dispatch.Event, fwd forwarded, token int64, contentType string, body []byte) {
	id := strconv.FormatInt(ev.ID, 10)
	ts := w.now().Unix()
	for name, values := range w.static {
		h[name] = values
	}
	h.Set("User-Agent", w.agent)
	h.Set("Content-Type", contentType)
	h.Set("Idempotency-Key", id)
	h.Set("X-Fencing-Token", strconv.FormatInt(token, 10))
	h.Set("webhook-id", id)
	h.Set("webhook-timestamp", strconv.FormatInt(ts, 10))
	if sig := w.signatures(id, ts, body); sig != "" {
		h.Set("webhook-signature", sig)
	}
	// A resent copy (outboxd resend) names the row it copies.
	if from, ok := fwd.get(dispatch.HeaderResentFrom); ok && isID(from) {
		h.Set(ResentFromHeader, from)
	}
	if w.ce.Enabled && w.ce.Mode != dispatch.CloudEventsStructured {
		for _, a := range w.ce.Binary(ev, dispatch.HTTPBinding) {
			h.Set(a.Key, a.Value)
		}
	}
}

// setTraceHeaders forwards the event's trace context: a valid traceparent,
// and its tracestate beside it.
func (w *Sink) setTraceHeaders(h http.Header, id int64, fwd forwarded) {
	tp, ok := fwd.get("traceparent")
	if !ok {
		return
	}
	if !validTraceparent(tp) {
		// A producer's bad header must not block the event: send it without.
		w.log.Warn("invalid traceparent dropped", "outbox_id", id, "traceparent", dispatch.Clip(tp, 128))
		return
	}
	h.Set("traceparent", tp)
	// tracestate belongs to its traceparent: forwarded only beside a
	// valid one, and only if it can be a header (W3C: at most 512).
	if ts, ok := fwd.get("tracestate"); ok && ts != "" && len(ts) <= 512 && dispatch.HeaderSafe(ts) {
		h.Set("tracestate", ts)
	}
}

// readResponse closes resp and returns the outcome its status means.
func (w *Sink) readResponse(ev dispatch.Event, resp *http.Response) error {
	if resp.StatusCode < 200 {
		// 101 Switching Protocols (net/http returns it; other 1xx end in
		// ErrInterim in the transport): the connection now speaks another
		// protocol and belongs to us. Never read it: close it, and count a
		// failed attempt.
		resp.Body.Close()
		return &dispatch.Error{Err: fmt.Errorf("webhook: event %d: POST %s: receiver answered %d %q: %w (want a final 2xx; protocol switches are not followed)",
			ev.ID, w.target, resp.StatusCode, dispatch.Clip(reason(resp), 128), dispatch.ErrInterim), Unanswered: true}
	}
	// Keep a little of a failure's answer for last_error; drain a little more
	// so the connection is reused.
	var snippet []byte
	if resp.StatusCode >= 300 {
		snippet, _ = io.ReadAll(io.LimitReader(resp.Body, 256))
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	return classify(ev.ID, resp, snippet, time.Now())
}

// body is the request body and its media type: the contract's JSON
// envelope, or in CloudEvents structured mode the event.
func (w *Sink) body(ev dispatch.Event) ([]byte, string, error) {
	if w.ce.Enabled && w.ce.Mode == dispatch.CloudEventsStructured {
		return w.ce.Structured(ev), dispatch.MediaTypeCloudEventsJSON, nil
	}
	if len(ev.Headers) == 0 {
		ev.Headers = json.RawMessage(`{}`)
	}
	b, err := envelope(ev)
	return b, dispatch.MediaTypeJSON, err
}

func classify(id int64, resp *http.Response, body []byte, now time.Time) error {
	code := resp.StatusCode
	if code >= 200 && code < 300 {
		return nil
	}
	// Receiver text is quoted (%q): whatever bytes it sent, the message is
	// printable, valid UTF-8 and bounded.
	msg := fmt.Sprintf("webhook: event %d: receiver answered %d %q", id, code, dispatch.Clip(reason(resp), 128))
	if code >= 300 && code < 400 {
		msg += " (redirects are not followed)"
		if loc, err := resp.Location(); err == nil {
			msg += " to " + displayURL(loc)
		}
	}
	if len(bytes.TrimSpace(body)) > 0 {
		msg += fmt.Sprintf(": %q", dispatch.Clip(string(bytes.TrimSpace(body)), 200))
	}
	err := &dispatch.Error{Err: errors.New(msg), Status: code}
	switch {
	case code == http.StatusMovedPermanently, code == http.StatusPermanentRedirect:
		err.Permanent = true // the URL is wrong for good: fix dispatch.webhook.url, then replay
	case code >= 300 && code < 400:
	case code == http.StatusRequestTimeout, code == http.StatusTooEarly,
		code == http.StatusTooManyRequests, code >= 500, destinationAnswer(code):
		err.RetryAfter = parseRetryAfter(resp.Header.Get("Retry-After"), now)
	default:
		err.Permanent = true
	}
	return err
}

// destinationAnswer reports whether a receiver's status is an answer about
// the destination, not the event: 401, 403 and 407 (a credential: rotated,
// expired, missing), 404 and 405 (the endpoint moved or is not deployed),
// 431 (the static headers too large). Every event would get it, so it is
// retried like a 5xx and counts toward the circuit breaker: fixing the
// destination lets the backlog go, where dead-lettering would make the
// operator replay every event.
func destinationAnswer(code int) bool {
	switch code {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusProxyAuthRequired,
		http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusRequestHeaderFieldsTooLarge:
		return true
	}
	return false
}

// reason is the status line's text after the code.
func reason(resp *http.Response) string {
	s := resp.Status
	if len(s) > 4 && s[3] == ' ' {
		return s[4:]
	}
	return ""
}

// parseRetryAfter reads delay-seconds or an HTTP date, capped at
// MaxRetryAfter; 0 if absent or invalid.
func parseRetryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseUint(v, 10, 64); err == nil || errors.Is(err, strconv.ErrRange) {
		if err != nil || s > uint64(MaxRetryAfter/time.Second) {
			return MaxRetryAfter
		}
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return min(t.Sub(now), MaxRetryAfter)
	}
	return 0
}

// forwarded is an event's headers object, read once for the entries a
// request forwards (traceparent, tracestate, outbox-resent-from); nil when
// it has no entry or does not parse.
type forwarded map[string]any

// readForwarded parses headers, unless it is empty ({} or nothing, what
// most events carry): then no parse and no allocation.
func readForwarded(headers json.RawMessage) forwarded {
	if t := bytes.TrimSpace(headers); len(t) == 0 || bytes.Equal(t, []byte("{}")) {
		return nil
	}
	var m map[string]any
	if json.Unmarshal(headers, &m) != nil {
		return nil
	}
	return m
}

// get returns the string entry named name, if any. Names match in any
// case, as HTTP header names do ("Traceparent" is the header); the exact
// name wins over other spellings, and among those the first in byte order,
// so the choice does not depend on map order.
func (m forwarded) get(name string) (string, bool) {
	key, found := name, false
	if _, found = m[name]; !found {
		for k := range m {
			if strings.EqualFold(k, name) && (!found || k < key) {
				key, found = k, true
			}
		}
	}
	s, ok := m[key].(string)
	return s, ok
}

// ResentFromHeader is the request header of a resent copy: the id of the
// delivered row it copies (the event's outbox-resent-from header).
const ResentFromHeader = "Outbox-Resent-From"

// isID: s is a decimal outbox id.
func isID(s string) bool {
	_, err := strconv.ParseInt(s, 10, 64)
	return err == nil && s != "" && s[0] != '+' && s[0] != '-'
}

// validTraceparent checks the W3C Trace Context form
// version-traceid-parentid-flags (lowercase hex, ids not all zero, version
// ff invalid; later versions may append fields after a dash).
func validTraceparent(s string) bool {
	if len(s) < 55 || (len(s) > 55 && (s[:2] == "00" || s[55] != '-')) {
		return false
	}
	if s[2] != '-' || s[35] != '-' || s[52] != '-' || s[:2] == "ff" {
		return false
	}
	for _, f := range []string{s[:2], s[3:35], s[36:52], s[53:55]} {
		if !lowerHex(f) {
			return false
		}
	}
	for i := 55; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' { // no spaces, controls (CR/LF) or non-ASCII in a header value
			return false
		}
	}
	return !allZero(s[3:35]) && !allZero(s[36:52])
}

func lowerHex(s string) bool {
	for i := range len(s) {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func allZero(s string) bool {
	for i := range len(s) {
		if s[i] != '0' {
			return false
		}
	}
	return true
}
