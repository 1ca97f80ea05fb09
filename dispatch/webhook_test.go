package dispatch_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/outboxd/outboxd/dispatch"
)

func event() dispatch.Event {
	return dispatch.Event{ID: 123, AggregateType: "deal", AggregateID: "42", EventType: "deal.funded",
		Payload: json.RawMessage(`{"amount":1}`), Headers: json.RawMessage(`{"traceparent":"00-aa-bb-01"}`),
		CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func TestWebhookRequestFollowsTheContract(t *testing.T) {
	var got *http.Request
	var body []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, body = r, must(io.ReadAll(r.Body))
		w.WriteHeader(http.StatusAccepted)
	}))
	defer srv.Close()
	raw := []byte("0123456789abcdef")
	w, err := dispatch.NewWebhook(dispatch.WebhookConfig{URL: srv.URL, Secret: "whsec_" + base64.StdEncoding.EncodeToString(raw)})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Send(context.Background(), event(), 9); err != nil {
		t.Fatalf("2xx must be success: %v", err)
	}
	if got.Method != http.MethodPost {
		t.Fatalf("method %s", got.Method)
	}
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"id", "aggregate_type", "aggregate_id", "event_type", "payload", "headers", "created_at"} {
		if _, ok := m[k]; !ok {
			t.Fatalf("body lacks %s: %s", k, body)
		}
	}
	if m["id"].(float64) != 123 || m["created_at"] != "2026-01-02T03:04:05Z" {
		t.Fatalf("body %s", body)
	}
	h := got.Header
	want := map[string]string{"Content-Type": "application/json", "Idempotency-Key": "123", "X-Fencing-Token": "9",
		"webhook-id": "123", "traceparent": "00-aa-bb-01"}
	for k, v := range want {
		if h.Get(k) != v {
			t.Errorf("header %s = %q, want %q", k, h.Get(k), v)
		}
	}
	ts := h.Get("webhook-timestamp")
	if _, err := strconv.ParseInt(ts, 10, 64); err != nil {
		t.Fatalf("webhook-timestamp %q", ts)
	}
	// Standard Webhooks: v1,base64(HMAC-SHA256(secret, "id.timestamp.body")).
	mac := hmac.New(sha256.New, raw)
	mac.Write([]byte("123." + ts + "." + string(body)))
	if sig := "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil)); h.Get("webhook-signature") != sig {
		t.Fatalf("signature %q, want %q", h.Get("webhook-signature"), sig)
	}
}

func TestNoSignatureWithoutSecret(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("webhook-signature") != "" {
			w.WriteHeader(http.StatusTeapot)
		}
	}))
	defer srv.Close()
	w, _ := dispatch.NewWebhook(dispatch.WebhookConfig{URL: srv.URL})
	if err := w.Send(context.Background(), event(), 1); err != nil {
		t.Fatal(err)
	}
}

func TestStatusClassification(t *testing.T) {
	for _, tc := range []struct {
		status     int
		retryAfter string
		ok         bool
		permanent  bool
		wait       time.Duration
	}{
		{200, "", true, false, 0}, {204, "", true, false, 0},
		{408, "", false, false, 0}, {425, "", false, false, 0},
		{429, "7", false, false, 7 * time.Second}, {500, "", false, false, 0},
		{503, "2", false, false, 2 * time.Second}, {400, "", false, true, 0},
		{401, "", false, true, 0}, {404, "", false, true, 0}, {410, "", false, true, 0},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if tc.retryAfter != "" {
				w.Header().Set("Retry-After", tc.retryAfter)
			}
			w.WriteHeader(tc.status)
		}))
		w, _ := dispatch.NewWebhook(dispatch.WebhookConfig{URL: srv.URL})
		err := w.Send(context.Background(), event(), 1)
		srv.Close()
		if (err == nil) != tc.ok || dispatch.IsPermanent(err) != tc.permanent || dispatch.RetryAfter(err) != tc.wait {
			t.Errorf("status %d: err %v permanent %t retryAfter %s; want ok %t permanent %t wait %s",
				tc.status, err, dispatch.IsPermanent(err), dispatch.RetryAfter(err), tc.ok, tc.permanent, tc.wait)
		}
	}
}

func TestTimeoutsAndConnectionErrorsAreRetryable(t *testing.T) {
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(time.Second):
		}
	}))
	defer slow.Close()
	w, _ := dispatch.NewWebhook(dispatch.WebhookConfig{URL: slow.URL, Timeout: 50 * time.Millisecond})
	if err := w.Send(context.Background(), event(), 1); err == nil || dispatch.IsPermanent(err) {
		t.Fatalf("timeout: %v, want a retryable error", err)
	}
	closed := httptest.NewServer(http.NotFoundHandler())
	url := closed.URL
	closed.Close()
	w, _ = dispatch.NewWebhook(dispatch.WebhookConfig{URL: url})
	if err := w.Send(context.Background(), event(), 1); err == nil || dispatch.IsPermanent(err) {
		t.Fatalf("connection refused: %v, want a retryable error", err)
	}
}

func TestBadConfigIsRefused(t *testing.T) {
	if _, err := dispatch.NewWebhook(dispatch.WebhookConfig{}); err == nil {
		t.Fatal("empty url accepted")
	}
	if _, err := dispatch.NewWebhook(dispatch.WebhookConfig{URL: "http://x", Secret: "whsec_!!!"}); err == nil {
		t.Fatal("undecodable whsec_ secret accepted")
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// A request whose deadline passes between the decision to send and the
// socket write is not written: simulated by a deadline already past when the
// connection is handed over (the sender "froze" in between).
func TestExpiredDeadlineIsNeverWritten(t *testing.T) {
	hits := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits++ }))
	defer srv.Close()
	w, _ := dispatch.NewWebhook(dispatch.WebhookConfig{URL: srv.URL})
	if err := w.Send(context.Background(), event(), 1); err != nil || hits != 1 {
		t.Fatalf("warm-up send: %v, hits %d", err, hits)
	}
	// The deadline passes while the pooled connection is fetched: the
	// context's own timer may not have fired yet, the write check catches it.
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(time.Millisecond))
	defer cancel()
	time.Sleep(2 * time.Millisecond)
	err := w.Send(ctx, event(), 1)
	if err == nil || hits != 1 {
		t.Fatalf("expired send: err %v, hits %d; want an error and nothing written", err, hits)
	}
}
