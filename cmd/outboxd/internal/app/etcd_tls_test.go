package app_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/app"
	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/lock"
)

// startTLSEtcd starts an embedded etcd whose clients must speak TLS with a
// certificate of dir's CA (writeCerts), and turns its auth on with the
// user root (password rootPass). It returns the client URL.
func startTLSEtcd(t *testing.T, dir, rootPass string) string {
	t.Helper()
	f := func(n string) string { return filepath.Join(dir, n) }
	cu := url.URL{Scheme: "https", Host: "127.0.0.1:" + fmt.Sprint(testenv.FreePort(t))}
	pu := url.URL{Scheme: "http", Host: "127.0.0.1:" + fmt.Sprint(testenv.FreePort(t))}
	cfg := embed.NewConfig()
	cfg.Dir, cfg.Name, cfg.LogLevel = t.TempDir(), "tls-test", "error"
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop()) // its shutdown errors are no finding
	cfg.ClientTLSInfo = transport.TLSInfo{CertFile: f("server.pem"), KeyFile: f("server-key.pem"), TrustedCAFile: f("ca.pem"), ClientCertAuth: true}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatalf("start etcd: %v", err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(time.Minute):
		t.Fatal("etcd not ready within a minute")
	}
	cert, err := tls.LoadX509KeyPair(f("client.pem"), f("client-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	ca, err := os.ReadFile(f("ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{cu.String()}, DialTimeout: 10 * time.Second, Logger: zap.NewNop(),
		TLS: &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: roots, MinVersion: tls.VersionTLS12}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := cli.UserAdd(ctx, "root", rootPass); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.UserGrantRole(ctx, "root", "root"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.AuthEnable(ctx); err != nil {
		t.Fatal(err)
	}
	return cu.String()
}

// etcd with TLS (client certificates required) and auth on: the lease is
// taken as the user whose password comes from lock.etcd.password_file; a
// wrong password stops the start naming that key, and a client without
// its certificate never reaches etcd.
func TestEtcdTLSAndAuth(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeCerts(t, dir)
	f := func(n string) string { return filepath.Join(dir, n) }
	endpoint := startTLSEtcd(t, dir, "etcd-s3cret")
	if err := os.WriteFile(f("etcd-password"), []byte("etcd-s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, dsn := testenv.Store(t)
	load := func(extra ...string) *config.Config {
		cfg, err := app.LoadConfig("", append([]string{
			"postgres.dsn=" + dsn, "lock.backend=etcd", "idempotency.store=postgres",
			"lock.etcd.endpoints=" + endpoint, "lock.etcd.username=root", "lock.etcd.password_file=" + f("etcd-password"),
			"lock.etcd.dial_timeout=3s", "lock.etcd.tls.enabled=true", "lock.etcd.tls.ca_file=" + f("ca.pem"),
		}, extra...))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	withCert := []string{"lock.etcd.tls.cert_file=" + f("client.pem"), "lock.etcd.tls.key_file=" + f("client-key.pem")}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a, err := app.New(ctx, load(withCert...), app.NewLogger("error", "json", os.Stderr))
	if err != nil {
		t.Fatalf("start over TLS as root: %v", err)
	}
	defer a.Close()
	l, err := a.Locks.TryAcquire(ctx, "lock:outbox:poller", lock.Options{TTL: 5 * time.Second})
	if err != nil {
		t.Fatalf("acquire over TLS as root: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// A wrong password is refused by etcd (auth is really on), naming the key.
	if err := os.WriteFile(f("etcd-password"), []byte("wrong\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bad, err := app.New(ctx, load(withCert...), app.NewLogger("error", "json", os.Stderr))
	var ke *config.KeyError
	if err == nil {
		bad.Close()
	}
	if !errors.As(err, &ke) || ke.Key != "lock.etcd.password_file" {
		t.Fatalf("wrong password: %v, want an error naming lock.etcd.password_file", err)
	}

	// Without the client certificate the TLS handshake fails: the start
	// waits and retries, as while etcd is unreachable, until its context ends.
	short, cancelShort := context.WithTimeout(ctx, 4*time.Second)
	defer cancelShort()
	nocert, err := app.New(short, load(), app.NewLogger("error", "json", os.Stderr))
	if err == nil {
		nocert.Close()
		t.Fatal("start without the client certificate succeeded; etcd requires one")
	}
}
