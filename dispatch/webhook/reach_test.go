package webhook_test

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/outboxd/outboxd/dispatch/webhook"
)

// reachRequest sends event() through a webhook built from cfg (its URL set
// here) and returns what the receiver got.
func reachRequest(t *testing.T, cfg webhook.Config) (http.Header, []byte) {
	t.Helper()
	var h http.Header
	var body []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, body = r.Header.Clone(), must(io.ReadAll(r.Body))
	}))
	defer srv.Close()
	cfg.URL = srv.URL
	w, err := webhook.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.SendEvent(context.Background(), event(), 7); err != nil {
		t.Fatal(err)
	}
	return h, body
}

// Static headers reach the receiver beside the contract's own, and every
// request names outboxd in its User-Agent.
func TestWebhookStaticHeadersAndUserAgent(t *testing.T) {
	h, _ := reachRequest(t, webhook.Config{
		Headers:   map[string]string{"x-api-key": "k-123", "X-Tenant": "acme"},
		UserAgent: "outboxd/v1.2.3",
	})
	for name, want := range map[string]string{"X-Api-Key": "k-123", "X-Tenant": "acme", "User-Agent": "outboxd/v1.2.3",
		"Idempotency-Key": "123", "X-Fencing-Token": "7", "Content-Type": "application/json"} {
		if got := h.Get(name); got != want {
			t.Errorf("%s: %q, want %q", name, got, want)
		}
	}
	if h, _ := reachRequest(t, webhook.Config{}); !strings.HasPrefix(h.Get("User-Agent"), "outboxd") {
		t.Errorf("User-Agent %q without a version given, want outboxd", h.Get("User-Agent"))
	}
}

// A static header cannot replace one of the webhook's own: the webhook is
// refused at construction, the error naming the header and not its value.
func TestWebhookStaticHeadersCannotReplaceTheContractsOwn(t *testing.T) {
	// Every reserved name, in the case a file might write it: the
	// contract's, the trace context's and the transport's.
	for _, name := range []string{"content-type", "Idempotency-Key", "X-Fencing-Token", "webhook-id", "Webhook-Signature", "User-Agent", "ce-id",
		"traceparent", "Tracestate", "TRACESTATE", "host", "Content-Length", "transfer-encoding", "Connection"} {
		_, err := webhook.New(webhook.Config{URL: "http://127.0.0.1:1/x", Headers: map[string]string{name: "s3cret-value"}})
		if !errors.Is(err, webhook.ErrReservedHeader) || strings.Contains(err.Error(), "s3cret-value") {
			t.Errorf("header %s: %v, want ErrReservedHeader without the value", name, err)
		}
		if _, err := webhook.ParseHeaderLines(name + ": s3cret-value\n"); !errors.Is(err, webhook.ErrReservedHeader) || strings.Contains(err.Error(), "s3cret-value") {
			t.Errorf("headers file line %s: %v, want ErrReservedHeader without the value", name, err)
		}
	}
	for _, bad := range []map[string]string{{"X-A": "v\r\nX-Injected: 1"}, {"X A": "v"}, {"": "v"}} {
		if _, err := webhook.New(webhook.Config{URL: "http://127.0.0.1:1/x", Headers: bad}); err == nil {
			t.Errorf("headers %q accepted", bad)
		}
	}
	got, err := webhook.ParseHeaderLines("# comment\nX-Api-Key: a: b\n\nx-other:  c \n")
	if err != nil || len(got) != 2 || got["X-Api-Key"] != "a: b" || got["X-Other"] != "c" {
		t.Errorf("ParseHeaderLines: %v %v", got, err)
	}
	for _, text := range []string{"X-Api-Key s3cret", "Webhook-Id: s3cret", "X-A: 1\nx-a: s3cret"} {
		if _, err := webhook.ParseHeaderLines(text); err == nil || strings.Contains(err.Error(), "s3cret") || !strings.Contains(err.Error(), "line ") {
			t.Errorf("ParseHeaderLines(%q): %v, want an error naming the line, not the value", text, err)
		}
	}
}

// Asymmetric signing: with a whsk_ key (its 32-byte seed or its 64-byte
// private key) each request carries a v1a signature that verifies with
// the public key over "id.timestamp.body" (Standard Webhooks; the
// reference Go library verifies only v1, so crypto/ed25519 checks v1a
// here), beside the v1 HMAC signature, which the reference library still
// verifies.
func TestWebhookAsymmetricSignatureVerifies(t *testing.T) {
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	secret := whsec("the-hmac-key-0123")
	for name, key := range map[string]string{
		"seed":        "whsk_" + base64.StdEncoding.EncodeToString(priv.Seed()),
		"private key": "whsk_" + base64.StdEncoding.EncodeToString(priv),
	} {
		t.Run(name, func(t *testing.T) {
			h, body := reachRequest(t, webhook.Config{Secret: secret, SigningKey: key})
			var v1a []string
			for _, s := range strings.Split(h.Get("webhook-signature"), " ") {
				if sig, ok := strings.CutPrefix(s, "v1a,"); ok {
					v1a = append(v1a, sig)
				}
			}
			if len(v1a) != 1 {
				t.Fatalf("webhook-signature %q: want one v1a signature", h.Get("webhook-signature"))
			}
			sig, err := base64.StdEncoding.DecodeString(v1a[0])
			if err != nil {
				t.Fatal(err)
			}
			msg := h.Get("webhook-id") + "." + h.Get("webhook-timestamp") + "." + string(body)
			if !ed25519.Verify(pub, []byte(msg), sig) {
				t.Fatal("the v1a signature does not verify with the public key")
			}
			if ed25519.Verify(pub, []byte(msg+" "), sig) {
				t.Fatal("the v1a signature verifies another body")
			}
			if _, err := strconv.ParseInt(h.Get("webhook-timestamp"), 10, 64); err != nil {
				t.Fatal(err)
			}
			wh, err := standardwebhooks.NewWebhook(secret)
			if err != nil {
				t.Fatal(err)
			}
			if err := wh.Verify(body, h); err != nil {
				t.Fatalf("the v1 signature beside v1a: %v", err)
			}
		})
	}
	other := make([]byte, 64)
	copy(other, priv.Seed())
	for _, bad := range []string{"whsec_" + base64.StdEncoding.EncodeToString(priv.Seed()), "whsk_%%%", "whsk_" + base64.StdEncoding.EncodeToString([]byte("short")),
		"whsk_" + base64.StdEncoding.EncodeToString(other)} {
		if _, err := webhook.New(webhook.Config{URL: "http://127.0.0.1:1/x", SigningKey: bad}); err == nil {
			t.Errorf("signing key %q accepted", bad)
		}
	}
}

// Static headers are bounded: at most MaxStaticHeaders of them, each name
// and value together at most MaxStaticHeaderBytes, whether given as a map
// or as the lines of a headers file; the limits themselves are accepted.
func TestStaticHeadersAreBounded(t *testing.T) {
	lines := func(n int) (string, map[string]string) {
		var b strings.Builder
		m := map[string]string{}
		for i := range n {
			fmt.Fprintf(&b, "X-H%d: v\n", i)
			m[fmt.Sprintf("X-H%d", i)] = "v"
		}
		return b.String(), m
	}
	text, m := lines(webhook.MaxStaticHeaders)
	if got, err := webhook.ParseHeaderLines(text); err != nil || len(got) != webhook.MaxStaticHeaders {
		t.Errorf("%d header lines: %d headers, %v; want all", webhook.MaxStaticHeaders, len(got), err)
	}
	if _, err := webhook.New(webhook.Config{URL: "http://127.0.0.1:1/x", Headers: m}); err != nil {
		t.Errorf("%d headers: %v, want accepted", webhook.MaxStaticHeaders, err)
	}
	text, m = lines(webhook.MaxStaticHeaders + 1)
	if _, err := webhook.ParseHeaderLines(text); err == nil {
		t.Errorf("%d header lines accepted", webhook.MaxStaticHeaders+1)
	}
	if _, err := webhook.New(webhook.Config{URL: "http://127.0.0.1:1/x", Headers: m}); err == nil {
		t.Errorf("%d headers accepted", webhook.MaxStaticHeaders+1)
	}
	name := "X-Long"
	fits := strings.Repeat("s", webhook.MaxStaticHeaderBytes-len(name))
	if err := webhook.CheckStaticHeader(name, fits); err != nil {
		t.Errorf("a header of %d bytes: %v, want accepted", webhook.MaxStaticHeaderBytes, err)
	}
	if err := webhook.CheckStaticHeader(name, fits+"s"); err == nil || strings.Contains(err.Error(), "sss") {
		t.Errorf("a header of %d bytes: %v, want refused without its value", webhook.MaxStaticHeaderBytes+1, err)
	}
	if _, err := webhook.ParseHeaderLines(name + ": " + fits + "s\n"); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("a header line of %d bytes: %v, want refused naming the line", webhook.MaxStaticHeaderBytes+1, err)
	}
}
