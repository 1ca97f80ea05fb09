package dispatch

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"
)

// WebhookConfig configures the webhook sink.
type WebhookConfig struct {
	URL     string
	Secret  string        // enables Standard Webhooks signatures; raw bytes, or base64 after "whsec_"
	Timeout time.Duration // per request; default 10 s
	Client  *http.Client  // optional; default a keep-alive client sized for parallel delivery
}

// Webhook POSTs each event as JSON. 2xx is delivered; 408, 425, 429, 5xx,
// timeouts and connection errors are retryable; other statuses are permanent.
// A request whose context deadline passes before its bytes reach the socket
// is never written (ErrDeadlinePassed), even if the sender was frozen
// between deciding to send and writing.
type Webhook struct {
	url    string
	secret []byte
	client *http.Client
	now    func() time.Time
}

// NewWebhook validates cfg and returns the sink.
func NewWebhook(cfg WebhookConfig) (*Webhook, error) {
	if cfg.URL == "" {
		return nil, fmt.Errorf("dispatch: webhook url is empty")
	}
	if _, err := http.NewRequest(http.MethodPost, cfg.URL, nil); err != nil {
		return nil, fmt.Errorf("dispatch: webhook url: %w", err)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	client := cfg.Client
	if client == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConns = 256
		tr.MaxIdleConnsPerHost = 256
		tr.ForceAttemptHTTP2 = false // one request per connection: the write deadline is per request
		tr.DialContext = dialDeadlineConns((&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext)
		client = &http.Client{Transport: tr}
	}
	client.Timeout = cfg.Timeout
	secret, err := decodeSecret(cfg.Secret)
	if err != nil {
		return nil, err
	}
	return &Webhook{url: cfg.URL, secret: secret, client: client, now: time.Now}, nil
}

// decodeSecret accepts a Standard Webhooks "whsec_<base64>" secret or any
// other string used as raw bytes.
func decodeSecret(s string) ([]byte, error) {
	const p = "whsec_"
	if len(s) > len(p) && s[:len(p)] == p {
		b, err := base64.StdEncoding.DecodeString(s[len(p):])
		if err != nil {
			return nil, fmt.Errorf("dispatch: webhook secret: whsec_ value is not base64: %w", err)
		}
		return b, nil
	}
	return []byte(s), nil
}

// Sign returns the Standard Webhooks signature header value for body.
func Sign(secret []byte, id string, ts int64, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	fmt.Fprintf(mac, "%s.%d.", id, ts)
	mac.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// Send implements Sink.
func (w *Webhook) Send(ctx context.Context, ev Event, token int64) error {
	if len(ev.Headers) == 0 {
		ev.Headers = json.RawMessage(`{}`)
	}
	body, err := json.Marshal(ev)
	if err != nil {
		return &Error{Err: fmt.Errorf("webhook: encode event %d: %w", ev.ID, err), Permanent: true}
	}
	req, err := http.NewRequestWithContext(withWriteDeadline(ctx), http.MethodPost, w.url, bytes.NewReader(body))
	if err != nil {
		return &Error{Err: fmt.Errorf("webhook: %w", err), Permanent: true}
	}
	id := strconv.FormatInt(ev.ID, 10)
	ts := w.now().Unix()
	h := req.Header
	h.Set("Content-Type", "application/json")
	h.Set("Idempotency-Key", id)
	h.Set("X-Fencing-Token", strconv.FormatInt(token, 10))
	h.Set("webhook-id", id)
	h.Set("webhook-timestamp", strconv.FormatInt(ts, 10))
	if len(w.secret) > 0 {
		h.Set("webhook-signature", Sign(w.secret, id, ts, body))
	}
	if tp := traceparent(ev.Headers); tp != "" {
		h.Set("traceparent", tp)
	}

	resp, err := w.client.Do(req)
	if err != nil {
		return &Error{Err: fmt.Errorf("webhook: event %d: %w", ev.ID, err)}
	}
	// Drain a little so the connection is reused.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	return classify(ev.ID, resp)
}

func classify(id int64, resp *http.Response) error {
	code := resp.StatusCode
	if code >= 200 && code < 300 {
		return nil
	}
	err := &Error{Err: fmt.Errorf("webhook: event %d: receiver answered %s", id, resp.Status)}
	switch {
	case code == http.StatusRequestTimeout, code == http.StatusTooEarly,
		code == http.StatusTooManyRequests, code >= 500:
		err.RetryAfter = parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
	default:
		err.Permanent = true
	}
	return err
}

// parseRetryAfter reads delay-seconds or an HTTP date; 0 if absent or invalid.
func parseRetryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(v); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

func traceparent(headers json.RawMessage) string {
	var m map[string]any
	if json.Unmarshal(headers, &m) != nil {
		return ""
	}
	if s, ok := m["traceparent"].(string); ok {
		return s
	}
	return ""
}
