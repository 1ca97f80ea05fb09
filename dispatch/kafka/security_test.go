package kafka

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/outboxd/outboxd/dispatch"
)

// TestSASL: each mechanism authenticates and delivers; a wrong password is
// a retryable failure whose error never contains the password.
func TestSASL(t *testing.T) {
	const user, pass, wrong = "outboxd", "s3cret-pass", "wrong-hunter2"
	for _, mech := range []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"} {
		t.Run(mech, func(t *testing.T) {
			t.Parallel()
			fake, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.EnableSASL(), kfake.Superuser(mech, user, pass))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(fake.Close)
			var auth kgo.Opt
			switch mech {
			case "PLAIN":
				auth = kgo.SASL(plain.Auth{User: user, Pass: pass}.AsMechanism())
			case "SCRAM-SHA-256":
				auth = kgo.SASL(scram.Auth{User: user, Pass: pass}.AsSha256Mechanism())
			default:
				auth = kgo.SASL(scram.Auth{User: user, Pass: pass}.AsSha512Mechanism())
			}
			c := newCluster(t, fake.ListenAddrs(), fake, auth)
			topic := c.topic("deal")
			c.create(1, topic)
			ok := c.sink(c.prefix+".{aggregate_type}", func(cfg *Config) { cfg.SASL = SASL{Mechanism: mech, Username: user, Password: pass} })
			wantOutcomes(t, send(t, ok, batch(event(1, "deal", "a"))), dispatch.Delivered)

			bad := c.sink(c.prefix+".{aggregate_type}", func(cfg *Config) {
				cfg.SASL = SASL{Mechanism: mech, Username: user, Password: wrong}
				cfg.Timeout = time.Second
			})
			out := send(t, bad, batch(event(2, "deal", "a")))
			wantOutcomes(t, out, dispatch.Retryable)
			msg := fmt.Sprint(out[0].Err)
			t.Logf("wrong password: %s", msg)
			if strings.Contains(msg, wrong) || !strings.Contains(msg, "check dispatch.kafka.sasl") {
				t.Errorf("wrong password: %q; want a pointer to the SASL settings, without the password", msg)
			}
		})
	}
}

// TestTLS: with Config.TLS the sink speaks TLS and verifies the broker's
// certificate; without it, it cannot talk to a TLS listener (retryable).
func TestTLS(t *testing.T) {
	server, roots := selfSigned(t)
	fake, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.TLS(server))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	c := newCluster(t, fake.ListenAddrs(), fake, kgo.DialTLSConfig(&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}))
	topic := c.topic("deal")
	c.create(1, topic)
	s := c.sink(c.prefix+".{aggregate_type}", func(cfg *Config) { cfg.TLS = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12} })
	wantOutcomes(t, send(t, s, batch(event(1, "deal", "a"))), dispatch.Delivered)

	untrusted := c.sink(c.prefix+".{aggregate_type}", func(cfg *Config) {
		cfg.TLS = &tls.Config{MinVersion: tls.VersionTLS12} // system roots: the test CA is not among them
		cfg.Timeout = time.Second
	})
	out := send(t, untrusted, batch(event(2, "deal", "a")))
	wantOutcomes(t, out, dispatch.Retryable)
	t.Logf("untrusted certificate: %v", out[0].Err)
	if msg := fmt.Sprint(out[0].Err); !strings.Contains(msg, "certificate") {
		t.Errorf("untrusted certificate: %q; want the TLS error named", msg)
	}
}

// selfSigned is a server config for 127.0.0.1 and the pool that trusts it.
func selfSigned(t *testing.T) (*tls.Config, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kfake"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, MinVersion: tls.VersionTLS12}, pool
}
