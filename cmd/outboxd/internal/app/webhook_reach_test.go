package app_test

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/app"
	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/internal/metrics"
	"github.com/outboxd/outboxd/internal/testkit"
)

// mtlsReceiver is an https receiver whose certificate the CA in dir
// signed and which requires a client certificate from that CA; it records
// the headers of each request it accepts.
func mtlsReceiver(t *testing.T, dir string) (*httptest.Server, chan http.Header) {
	t.Helper()
	got := make(chan http.Header, 4)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Clone()
	}))
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(must(os.ReadFile(filepath.Join(dir, "ca.pem")))) {
		t.Fatal("ca.pem")
	}
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv, got
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// send builds the configured sink and sends one event through it.
func send(t *testing.T, c *config.Config) dispatch.Result {
	t.Helper()
	a := &app.App{Cfg: c, Log: testkit.Logger(t), Metrics: metrics.New()}
	sink, err := a.Sink()
	if err != nil {
		t.Fatal(err)
	}
	defer app.CloseSink(sink)
	ev := dispatch.Event{ID: 1, AggregateType: "deal", AggregateID: "1", EventType: "deal.notify", Payload: []byte(`{}`), CreatedAt: time.Now()}
	return sink.Send(context.Background(), dispatch.Batch{Events: []dispatch.Event{ev}, Token: 1,
		Until: func() time.Time { return time.Now().Add(10 * time.Second) }})[0]
}

// The webhook's reach from the configuration: a receiver that requires a
// client certificate, signed by a CA of its own, gets the request only with
// dispatch.webhook.tls.*; static headers come from the map and from
// headers_file; the signing key from signing_key_file; a named destination
// takes the same keys. `outboxd config` shows none of the secrets.
func TestWebhookReachFromTheConfiguration(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeCerts(t, dir)
	srv, got := mtlsReceiver(t, dir)
	_, priv, _ := ed25519.GenerateKey(nil)
	keyFile := filepath.Join(dir, "whsk")
	headersFile := filepath.Join(dir, "headers")
	if err := os.WriteFile(keyFile, []byte("whsk_"+base64.StdEncoding.EncodeToString(priv.Seed())+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(headersFile, []byte("# the receiver's token\nAuthorization: Bearer file-s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	section := `{url: "` + srv.URL + `/in", headers: {X-Api-Key: map-s3cret}, headers_file: ` + headersFile +
		`, signing_key_file: ` + keyFile + `, tls: {ca_file: ` + filepath.Join(dir, "ca.pem") +
		`, cert_file: ` + filepath.Join(dir, "client.pem") + `, key_file: ` + filepath.Join(dir, "client-key.pem") + `}}`
	for name, yaml := range map[string]string{
		"top level":   "dispatch:\n  sink: webhook\n  webhook: " + section + "\n",
		"destination": "dispatch:\n  destinations:\n    hook:\n      sink: webhook\n      webhook: " + section + "\n  routes:\n    - {event_type: \"*\", to: hook}\n",
	} {
		t.Run(name, func(t *testing.T) {
			c, err := app.LoadConfig(writeFile(t, yaml), nil)
			if err != nil {
				t.Fatal(err)
			}
			if r := send(t, c); r.Outcome != dispatch.Delivered {
				t.Fatalf("send: %v %v, want delivered", r.Outcome, r.Err)
			}
			h := <-got
			if h.Get("X-Api-Key") != "map-s3cret" || h.Get("Authorization") != "Bearer file-s3cret" ||
				!strings.Contains(h.Get("webhook-signature"), "v1a,") || !strings.HasPrefix(h.Get("User-Agent"), "outboxd/") {
				t.Fatalf("headers %v: want the static ones, a v1a signature and User-Agent outboxd/<version>", h)
			}
			out := strings.Join(flatten(c.Redacted()), " ")
			for _, s := range []string{"map-s3cret", "file-s3cret", base64.StdEncoding.EncodeToString(priv.Seed())} {
				if strings.Contains(out, s) {
					t.Fatalf("outboxd config shows %q: %s", s, out)
				}
			}

			// Without the client certificate the receiver refuses the connection.
			noCert := strings.NewReplacer(", cert_file: "+filepath.Join(dir, "client.pem"), "", ", key_file: "+filepath.Join(dir, "client-key.pem"), "").Replace(yaml)
			c, err = app.LoadConfig(writeFile(t, noCert), nil)
			if err != nil {
				t.Fatal(err)
			}
			if r := send(t, c); r.Outcome != dispatch.Retryable {
				t.Fatalf("without a client certificate: %v, want a retryable failure", r.Outcome)
			}
		})
	}
}

// Static headers that would replace the contract's own, or a bad file,
// exit 2 naming the key; a signing key like the secret names its key and
// never shows the value.
func TestWebhookReachErrorsNameTheKey(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	reserved := filepath.Join(dir, "reserved")
	if err := os.WriteFile(reserved, []byte("X-Fencing-Token: 99\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.pem")
	writeCerts(t, dir)
	for _, tc := range []struct {
		sets []string
		key  string
	}{
		{[]string{"dispatch.webhook.headers.idempotency-key=s3cret"}, "dispatch.webhook.headers.idempotency-key"},
		{[]string{"dispatch.webhook.headers.webhook-signature=s3cret"}, "dispatch.webhook.headers.webhook-signature"},
		{[]string{"dispatch.webhook.headers.content-type=text/plain"}, "dispatch.webhook.headers.content-type"},
		{[]string{"dispatch.webhook.headers_file=" + reserved}, "dispatch.webhook.headers_file"},
		{[]string{"dispatch.webhook.headers_file=" + filepath.Join(dir, "missing")}, "dispatch.webhook.headers_file"},
		{[]string{"dispatch.webhook.signing_key=whsk_s3cret"}, "dispatch.webhook.signing_key"},
		{[]string{"dispatch.webhook.tls.ca_file=" + caFile}, "dispatch.webhook.tls"}, // an http URL
		{[]string{"dispatch.webhook.url=https://h/x", "dispatch.webhook.tls.cert_file=" + caFile}, "dispatch.webhook.tls.key_file"},
		{[]string{"dispatch.sink=noop", "dispatch.destinations.d.sink=webhook", "dispatch.destinations.d.webhook.headers.x-fencing-token=1"}, "dispatch.destinations.d.webhook.headers.x-fencing-token"},
	} {
		_, err := app.LoadConfig("", tc.sets)
		var ke *config.KeyError
		if !errors.As(err, &ke) || ke.Key != tc.key || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%v: %v, want a KeyError naming %s without the value", tc.sets, err, tc.key)
		}
	}
}

// Static headers are a map: the environment, which holds strings, names
// the key rather than guess a format.
func TestWebhookHeadersFromTheEnvironmentNameTheKey(t *testing.T) {
	t.Setenv("OUTBOXD_DISPATCH_WEBHOOK_HEADERS", "X-A: 1")
	_, err := app.LoadConfig("", nil)
	var ke *config.KeyError
	if !errors.As(err, &ke) || ke.Key != "dispatch.webhook.headers" {
		t.Errorf("headers from the environment: %v, want a KeyError naming dispatch.webhook.headers", err)
	}
}
