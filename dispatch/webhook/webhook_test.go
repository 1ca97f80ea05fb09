package webhook_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/dispatch/webhook"
)

func event() dispatch.Event {
	return dispatch.Event{ID: 123, AggregateType: "deal", AggregateID: "42", EventType: "deal.funded",
		Payload: json.RawMessage(`{"amount":1}`), Headers: json.RawMessage(`{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}`),
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
	w, err := webhook.New(webhook.Config{URL: srv.URL, Secret: "whsec_" + base64.StdEncoding.EncodeToString(raw)})
	if err != nil {
		t.Fatal(err)
	}
	ev := event()
	ev.Fingerprint = "hogob5ml4w.e345fcd3.c73436916fc1b368" // a broker's dedupe id only: not in the body
	if err := w.SendEvent(context.Background(), ev, 9); err != nil {
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
	if len(m) != 7 {
		t.Fatalf("body has %d fields, want the contract's 7: %s", len(m), body)
	}
	if m["id"].(float64) != 123 || m["created_at"] != "2026-01-02T03:04:05Z" {
		t.Fatalf("body %s", body)
	}
	h := got.Header
	want := map[string]string{"Content-Type": "application/json", "Idempotency-Key": "123", "X-Fencing-Token": "9",
		"webhook-id": "123", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
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
	w, _ := webhook.New(webhook.Config{URL: srv.URL})
	if err := w.SendEvent(context.Background(), event(), 1); err != nil {
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
		{410, "", false, true, 0}, {422, "", false, true, 0},
		// Answers about the destination, not the event: retried like a 5xx.
		{401, "", false, false, 0}, {403, "3", false, false, 3 * time.Second}, {404, "", false, false, 0},
		{405, "", false, false, 0}, {407, "", false, false, 0}, {431, "", false, false, 0},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if tc.retryAfter != "" {
				w.Header().Set("Retry-After", tc.retryAfter)
			}
			w.WriteHeader(tc.status)
		}))
		w, _ := webhook.New(webhook.Config{URL: srv.URL})
		err := w.SendEvent(context.Background(), event(), 1)
		srv.Close()
		if (err == nil) != tc.ok || dispatch.IsPermanent(err) != tc.permanent || dispatch.RetryAfter(err) != tc.wait {
			t.Errorf("status %d: err %v permanent %t retryAfter %s; want ok %t permanent %t wait %s",
				tc.status, err, dispatch.IsPermanent(err), dispatch.RetryAfter(err), tc.ok, tc.permanent, tc.wait)
		}
	}
}

// Each status through a webhook behind a breaker (Failures 3, three
// aggregates): an answer about the destination (401, 403, 404, 405, 407,
// 431), like a 5xx, is retried and opens the circuit, no event charged
// once it is open; a row's own 4xx dead-letters its event and leaves the
// circuit closed. last_error's text names the status and the receiver's
// answer.
func TestWebhookStatusesAboutTheDestinationCountTowardTheBreaker(t *testing.T) {
	for _, tc := range []struct {
		status      int
		destination bool // retried and counted by the breaker; else dead-lettered at once
	}{
		{401, true}, {403, true}, {404, true}, {405, true}, {407, true}, {431, true}, {500, true}, {503, true},
		{400, false}, {409, false}, {410, false}, {413, false}, {415, false}, {422, false},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(tc.status)
			fmt.Fprint(w, "answer-of-the-receiver")
		}))
		w, err := webhook.New(webhook.Config{URL: srv.URL, Concurrency: 1})
		if err != nil {
			t.Fatal(err)
		}
		b := dispatch.NewBreaker("default", w, dispatch.BreakerConfig{Failures: 3, ProbeEvery: time.Hour})
		res := b.Send(context.Background(), batchOf("a", "b", "c", "d"))
		srv.Close()
		want, open := dispatch.Permanent, false
		if tc.destination {
			want, open = dispatch.Retryable, true
		}
		if b.State().Open != open {
			t.Errorf("status %d: circuit open %v, want %v", tc.status, b.State().Open, open)
		}
		for i, r := range res[:2] {
			text := ""
			if r.Err != nil {
				text = r.Err.Error()
			}
			if r.Outcome != want || !strings.Contains(text, strconv.Itoa(tc.status)) || !strings.Contains(text, "answer-of-the-receiver") {
				t.Errorf("status %d: event %d %v %q, want %v naming the status and the receiver's answer", tc.status, i+1, r.Outcome, text, want)
			}
		}
		if tc.destination && (res[2].Outcome != dispatch.NotAttempted || res[3].Outcome != dispatch.NotAttempted) {
			t.Errorf("status %d: the third and fourth events %v %v, want NotAttempted (the circuit opened)", tc.status, res[2].Outcome, res[3].Outcome)
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
	w, _ := webhook.New(webhook.Config{URL: slow.URL, Timeout: 50 * time.Millisecond})
	if err := w.SendEvent(context.Background(), event(), 1); err == nil || dispatch.IsPermanent(err) {
		t.Fatalf("timeout: %v, want a retryable error", err)
	}
	closed := httptest.NewServer(http.NotFoundHandler())
	url := closed.URL
	closed.Close()
	w, _ = webhook.New(webhook.Config{URL: url})
	if err := w.SendEvent(context.Background(), event(), 1); err == nil || dispatch.IsPermanent(err) {
		t.Fatalf("connection refused: %v, want a retryable error", err)
	}
}

func TestBadConfigIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  webhook.Config
		want []string // the error names what is wrong
	}{
		{"empty url", webhook.Config{}, []string{"webhook url", "empty"}},
		{"relative url", webhook.Config{URL: "/hook"}, []string{"webhook url", "absolute http(s) URL"}},
		{"other scheme", webhook.Config{URL: "ftp://x/hook"}, []string{"webhook url", `scheme "ftp"`}},
		{"unparsable url", webhook.Config{URL: "http://user:pa%zzword@x/"}, []string{"webhook url", "cannot be parsed"}},
		{"undecodable whsec_ secret", webhook.Config{URL: "http://x", Secret: "whsec_!!!"}, []string{"webhook secret", "whsec_", "base64"}},
		{"empty whsec_ secret", webhook.Config{URL: "http://x", Secret: "whsec_"}, []string{"webhook secret", "no key bytes"}},
	} {
		_, err := webhook.New(tc.cfg)
		if err == nil {
			t.Errorf("%s: accepted", tc.name)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not say %q", tc.name, err, w)
			}
		}
		if strings.Contains(err.Error(), "pa%zzword") {
			t.Errorf("%s: error %q quotes the URL's password", tc.name, err)
		}
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// A request whose context has already expired is not sent. This does not
// exercise the write-time check at the socket (the context's own timer has
// fired, so the HTTP client refuses first); TestFrozenSenderWritesNothingPastTheDeadline
// does.
func TestExpiredDeadlineIsNeverWritten(t *testing.T) {
	hits := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits++ }))
	defer srv.Close()
	w, _ := webhook.New(webhook.Config{URL: srv.URL})
	if err := w.SendEvent(context.Background(), event(), 1); err != nil || hits != 1 {
		t.Fatalf("warm-up send: %v, hits %d", err, hits)
	}
	// The deadline passes while the pooled connection is fetched: the
	// context's own timer may not have fired yet, the write check catches it.
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(time.Millisecond))
	defer cancel()
	time.Sleep(2 * time.Millisecond)
	err := w.SendEvent(ctx, event(), 1)
	if err == nil || hits != 1 {
		t.Fatalf("expired send: err %v, hits %d; want an error and nothing written", err, hits)
	}
}

// counter is a receiver that counts requests by method.
type counter struct {
	mu      sync.Mutex
	methods []string
}

func (c *counter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	c.methods = append(c.methods, r.Method)
	c.mu.Unlock()
}

func (c *counter) seen() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.methods...)
}

// Redirects are never followed: the signed body goes only to the configured
// URL, a 3xx is a failure, and 301/308 are permanent.
func TestRedirectsAreNeverFollowed(t *testing.T) {
	for _, code := range []int{301, 302, 303, 307, 308} {
		elsewhere := &counter{}
		other := httptest.NewServer(elsewhere)
		first := &counter{}
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			first.ServeHTTP(w, r)
			http.Redirect(w, r, other.URL+"/moved?token=SECRET", code)
		}))
		w, err := webhook.New(webhook.Config{URL: srv.URL, Secret: "s"})
		if err != nil {
			t.Fatal(err)
		}
		err = w.SendEvent(context.Background(), event(), 1)
		srv.Close()
		other.Close()
		if err == nil {
			t.Fatalf("%d counted as delivered", code)
		}
		if got := first.seen(); len(got) != 1 || got[0] != http.MethodPost {
			t.Errorf("%d: the receiver saw %v, want one POST", code, got)
		}
		if got := elsewhere.seen(); len(got) != 0 {
			t.Errorf("%d: the redirect target received %v; it must receive nothing", code, got)
		}
		wantPermanent := code == 301 || code == 308
		if dispatch.IsPermanent(err) != wantPermanent {
			t.Errorf("%d: permanent = %t, want %t", code, dispatch.IsPermanent(err), wantPermanent)
		}
		if msg := err.Error(); !strings.Contains(msg, strconv.Itoa(code)) || strings.Contains(msg, "SECRET") || !strings.Contains(msg, "/moved") {
			t.Errorf("%d: error %q should name the code and the target path, without its query", code, msg)
		}
	}
}

// Retry-After is parsed without overflow and capped.
func TestRetryAfterIsBounded(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  time.Duration
	}{
		{"7", 7 * time.Second},
		{"315360000", webhook.MaxRetryAfter},            // ten years
		{"99999999999", webhook.MaxRetryAfter},          // overflows a Duration in seconds
		{"18446744073709551616", webhook.MaxRetryAfter}, // overflows uint64
		{"-5", 0}, {"1.5", 0}, {"soon", 0},
		{time.Now().Add(100 * 365 * 24 * time.Hour).UTC().Format(http.TimeFormat), webhook.MaxRetryAfter},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", tc.value)
			w.WriteHeader(http.StatusServiceUnavailable)
		}))
		w, _ := webhook.New(webhook.Config{URL: srv.URL})
		err := w.SendEvent(context.Background(), event(), 1)
		srv.Close()
		if got := dispatch.RetryAfter(err); got != tc.want {
			t.Errorf("Retry-After %q: got %s, want %s", tc.value, got, tc.want)
		}
	}
}

// A traceparent that would make an invalid header (CR/LF) or is not W3C
// form is dropped with a warning (its tracestate with it), and the event is
// delivered; a valid one is forwarded unchanged, with its tracestate.
func TestInvalidTraceparentIsDroppedNotRetried(t *testing.T) {
	const valid = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	const state = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
	var mu sync.Mutex
	var got []http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Clone())
		mu.Unlock()
	}))
	defer srv.Close()
	var logs bytes.Buffer
	w, _ := webhook.New(webhook.Config{URL: srv.URL, Log: slog.New(slog.NewJSONHandler(&logs, nil))})
	for _, tc := range []struct {
		tp      string
		forward bool
	}{
		{valid, true},
		{"01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-future", true},
		{valid + "\r\nX-Evil: 1", false},
		{"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-x", false},
		{"00-00000000000000000000000000000000-b7ad6b7169203331-01", false},
		{"00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01", false},
		{"ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", false},
		{"01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-\n", false},
		{"garbage", false},
	} {
		mu.Lock()
		got = nil
		mu.Unlock()
		logs.Reset()
		ev := event()
		ev.Headers = must(json.Marshal(map[string]string{"traceparent": tc.tp, "tracestate": state}))
		if err := w.SendEvent(context.Background(), ev, 1); err != nil {
			t.Fatalf("traceparent %q: %v, want delivered", tc.tp, err)
		}
		mu.Lock()
		h := got[0]
		mu.Unlock()
		if tc.forward && (h.Get("traceparent") != tc.tp || h.Get("tracestate") != state) {
			t.Errorf("traceparent %q not forwarded with its tracestate: got %q, %q", tc.tp, h.Get("traceparent"), h.Get("tracestate"))
		}
		if !tc.forward {
			if h.Get("traceparent") != "" || h.Get("tracestate") != "" || h.Get("X-Evil") != "" {
				t.Errorf("traceparent %q forwarded as %q (X-Evil %q)", tc.tp, h.Get("traceparent"), h.Get("X-Evil"))
			}
			if !strings.Contains(logs.String(), `"msg":"invalid traceparent dropped"`) || !strings.Contains(logs.String(), `"outbox_id":123`) {
				t.Errorf("traceparent %q dropped without a warning naming the event: %s", tc.tp, logs.String())
			}
		}
	}
}

// A row's trace headers are found whatever the case of their names (HTTP
// header names are case-insensitive, and producers write "Traceparent"):
// forwarded as traceparent and tracestate. An exact "traceparent" wins over
// another spelling beside it.
func TestTraceHeadersAreMatchedInAnyCase(t *testing.T) {
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	const other = "00-11111111111111111111111111111111-2222222222222222-01"
	const state = "rojo=00f067aa0ba902b7"
	var mu sync.Mutex
	var got http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = r.Header.Clone()
		mu.Unlock()
	}))
	defer srv.Close()
	w, err := webhook.New(webhook.Config{URL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ headers, wantParent, wantState string }{
		{`{"Traceparent":"` + tp + `","TraceState":"` + state + `"}`, tp, state},
		{`{"TRACEPARENT":"` + tp + `"}`, tp, ""},
		{`{"Traceparent":"` + other + `","traceparent":"` + tp + `","tracestate":"` + state + `"}`, tp, state},
	} {
		ev := event()
		ev.Headers = json.RawMessage(c.headers)
		if err := w.SendEvent(context.Background(), ev, 1); err != nil {
			t.Fatalf("headers %s: %v", c.headers, err)
		}
		mu.Lock()
		h := got
		mu.Unlock()
		if h.Get("traceparent") != c.wantParent || h.Get("tracestate") != c.wantState {
			t.Errorf("row headers %s: sent traceparent %q, tracestate %q; want %q, %q", c.headers, h.Get("traceparent"), h.Get("tracestate"), c.wantParent, c.wantState)
		}
	}
}

// Error texts never carry the URL's credentials or query.
func TestErrorsDoNotLeakTheURLsSecrets(t *testing.T) {
	closed := httptest.NewServer(http.NotFoundHandler())
	host := closed.Listener.Addr().String()
	closed.Close()
	w, err := webhook.New(webhook.Config{URL: "http://user:PASSWORD@" + host + "/hook?token=TOKEN"})
	if err != nil {
		t.Fatal(err)
	}
	err = w.SendEvent(context.Background(), event(), 1)
	if err == nil || strings.Contains(err.Error(), "PASSWORD") || strings.Contains(err.Error(), "TOKEN") ||
		!strings.Contains(err.Error(), host+"/hook") {
		t.Fatalf("error %v: want the host and path, without credentials or query", err)
	}
}

// Whatever bytes a receiver puts in its status line or body, the error text
// is valid UTF-8 without NUL and bounded.
func TestReceiverTextIsQuoted(t *testing.T) {
	long := strings.Repeat("é", 3000)
	for _, status := range []string{"500 Bad \xe9 thing", "500 Bad \x00 thing", "500 " + long} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
				return
			}
			fmt.Fprintf(c, "HTTP/1.1 %s\r\nContent-Length: 5\r\nConnection: close\r\n\r\n\xff\x00abc", status)
		}()
		w, _ := webhook.New(webhook.Config{URL: "http://" + ln.Addr().String()})
		err = w.SendEvent(context.Background(), event(), 1)
		<-done
		ln.Close()
		if err == nil || dispatch.IsPermanent(err) {
			t.Fatalf("status %.20q: %v, want a retryable error", status, err)
		}
		msg := err.Error()
		if !utf8.ValidString(msg) || strings.ContainsRune(msg, 0) || len(msg) > 600 || !strings.Contains(msg, "500") {
			t.Errorf("status %.20q: error text %.80q is not clean and bounded (%d bytes)", status, msg, len(msg))
		}
	}
}
