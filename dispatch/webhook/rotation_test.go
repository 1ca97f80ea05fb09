package webhook_test

import (
	"encoding/base64"
	"errors"
	"net/http"
	"strings"
	"testing"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/outboxd/outboxd/dispatch/webhook"
)

// whsec is a Standard Webhooks secret of key.
func whsec(key string) string { return "whsec_" + base64.StdEncoding.EncodeToString([]byte(key)) }

// signedRequest sends event() through a webhook signing with secret and
// returns what the receiver got.
func signedRequest(t *testing.T, secret string) (http.Header, []byte) {
	t.Helper()
	return reachRequest(t, webhook.Config{Secret: secret})
}

// Rotation: with the new secret first and the old one after, every request
// carries one v1 signature per secret, in that order, and the Standard
// Webhooks reference library verifies it holding only the old secret, only
// the new one, or both; a receiver with neither refuses it. The list is
// read alike from a YAML list (one per line) and from an environment
// variable (space or comma separated).
func TestWebhookSecretRotationVerifiesWithTheReferenceLibrary(t *testing.T) {
	newSecret, oldSecret, other := whsec("the-new-key-0123"), whsec("the-old-key-4567"), whsec("someone-else-89")
	verifier := func(secret string) *standardwebhooks.Webhook {
		wh, err := standardwebhooks.NewWebhook(secret)
		if err != nil {
			t.Fatal(err)
		}
		return wh
	}
	for name, setting := range map[string]string{
		"yaml list":   newSecret + "\n" + oldSecret,
		"env, spaces": newSecret + " " + oldSecret,
		"env, commas": newSecret + "," + oldSecret,
		"secret_file": "\n" + newSecret + "\n\n" + oldSecret + "\n",
		"env, both":   newSecret + ", " + oldSecret,
	} {
		t.Run(name, func(t *testing.T) {
			h, body := signedRequest(t, setting)
			sigs := strings.Split(h.Get("webhook-signature"), " ")
			if len(sigs) != 2 {
				t.Fatalf("webhook-signature %q: want two space-separated signatures", h.Get("webhook-signature"))
			}
			for _, s := range []string{newSecret, oldSecret} {
				if err := verifier(s).Verify(body, h); err != nil {
					t.Errorf("a receiver holding only one of the secrets refuses the request: %v", err)
				}
			}
			if err := verifier(other).Verify(body, h); !errors.Is(err, standardwebhooks.ErrNoMatchingSignature) {
				t.Errorf("a receiver with another secret: %v, want ErrNoMatchingSignature", err)
			}
			// The current (first) secret signs first.
			first := h.Clone()
			first.Set("webhook-signature", sigs[0])
			if err := verifier(newSecret).Verify(body, first); err != nil {
				t.Errorf("the first signature is not the new secret's: %v", err)
			}
		})
	}
}

// One secret: one signature. A raw secret (no whsec_) is taken whole,
// spaces and commas included, as earlier versions took it.
func TestWebhookSingleSecretsStayCompatible(t *testing.T) {
	for _, tc := range []struct {
		setting string
		key     []byte
	}{
		{whsec("only-one-key"), []byte("only-one-key")},
		{"a raw secret, with spaces", []byte("a raw secret, with spaces")},
	} {
		h, body := signedRequest(t, tc.setting)
		if sig := h.Get("webhook-signature"); strings.Count(sig, "v1,") != 1 {
			t.Errorf("%q: webhook-signature %q, want one signature", tc.setting, sig)
		}
		wh, _ := standardwebhooks.NewWebhookRaw(tc.key)
		if err := wh.Verify(body, h); err != nil {
			t.Errorf("%q: %v", tc.setting, err)
		}
	}
}

// A bad secret in a list is refused naming its place, never its text.
func TestWebhookSecretListErrors(t *testing.T) {
	_, err := webhook.ParseSecrets(whsec("fine-key") + " whsec_!!!notbase64")
	if err == nil || !strings.Contains(err.Error(), "secret 2 of 2") || strings.Contains(err.Error(), "notbase64") {
		t.Fatalf("got %v, want an error naming secret 2 without its text", err)
	}
	if s, err := webhook.ParseSecrets(""); err != nil || len(s) != 0 {
		t.Fatalf("empty: %v %v, want no secrets", s, err)
	}
}
