package app_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/app"
	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/lock"
)

// writeCerts makes a CA, a server certificate for 127.0.0.1 and a client
// certificate, as PEM files in dir.
func writeCerts(t *testing.T, dir string) {
	t.Helper()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	write := func(name, typ string, der []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	caKey := key()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "outboxd test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	write("ca.pem", "CERTIFICATE", caDER)
	for i, leaf := range []struct {
		name  string
		usage x509.ExtKeyUsage
	}{{"server", x509.ExtKeyUsageServerAuth}, {"client", x509.ExtKeyUsageClientAuth}} {
		k := key()
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(int64(i + 2)), Subject: pkix.Name{CommonName: leaf.name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{leaf.usage},
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, _ := x509.MarshalECPrivateKey(k)
		write(leaf.name+".pem", "CERTIFICATE", der)
		write(leaf.name+"-key.pem", "EC PRIVATE KEY", kder)
	}
}

// Redis with TLS (client certificates required) and an ACL user; the
// password comes from a *_file key.
func TestRedisTLSAndACL(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeCerts(t, dir)
	tlsPort := testenv.FreePort(t)
	f := func(n string) string { return filepath.Join(dir, n) }
	testenv.StartRedisServerArgs(t,
		"--tls-port", strconv.Itoa(tlsPort), "--tls-cert-file", f("server.pem"), "--tls-key-file", f("server-key.pem"),
		"--tls-ca-cert-file", f("ca.pem"), "--tls-auth-clients", "yes",
		"--user", "default", "off", "--user", "outboxd", "on", ">acl-s3cret", "~*", "&*", "+@all")
	if err := os.WriteFile(f("redis-password"), []byte("acl-s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, dsn := testenv.Store(t)
	load := func(extra ...string) *config.Config {
		cfg, err := app.LoadConfig("", append([]string{
			"postgres.dsn=" + dsn, "redis.addrs=127.0.0.1:" + strconv.Itoa(tlsPort), "redis.username=outboxd",
			"redis.password_file=" + f("redis-password"),
			"redis.tls.enabled=true", "redis.tls.ca_file=" + f("ca.pem"),
			"redis.tls.cert_file=" + f("client.pem"), "redis.tls.key_file=" + f("client-key.pem"),
		}, extra...))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	ctx := context.Background()
	a, err := app.New(ctx, load(), app.NewLogger("error", "json", os.Stderr))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	l, err := a.Locks.TryAcquire(ctx, "lock:outbox:poller", lock.Options{TTL: 5 * time.Second})
	if err != nil {
		t.Fatalf("acquire over TLS as an ACL user: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// A wrong password is refused (the ACL is really in force).
	if err := os.WriteFile(f("redis-password"), []byte("wrong"), 0o600); err != nil {
		t.Fatal(err)
	}
	bad, err := app.New(ctx, load(), app.NewLogger("error", "json", os.Stderr))
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	_, err = bad.Locks.TryAcquire(ctx, "lock:outbox:poller", lock.Options{TTL: 5 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Fatalf("wrong password: %v, want WRONGPASS", err)
	}
}
