package etcdlease_test

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// server is an embedded one-member etcd on free loopback ports, with its
// data in dir. Its election timeout is short, so its minimum lease TTL is
// one second.
type server struct {
	dir              string
	client, peerAddr string
	e                *embed.Etcd
}

// freeAddr is a loopback address with a port nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// newServer starts an etcd with data in a fresh temp dir, stopped at cleanup.
func newServer(t *testing.T) *server {
	t.Helper()
	s := &server{dir: t.TempDir(), client: freeAddr(t), peerAddr: freeAddr(t)}
	s.start(t)
	t.Cleanup(s.stop)
	return s
}

// start runs the server on its ports with its data dir.
func (s *server) start(t *testing.T) {
	t.Helper()
	cu := url.URL{Scheme: "http", Host: s.client}
	pu := url.URL{Scheme: "http", Host: s.peerAddr}
	cfg := embed.NewConfig()
	cfg.Dir = s.dir
	cfg.Name = "lease-test"
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = fmt.Sprintf("%s=%s", cfg.Name, pu.String())
	cfg.TickMs, cfg.ElectionMs = 10, 100
	cfg.LogLevel = "error"
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatalf("start etcd: %v", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(time.Minute):
		e.Close()
		t.Fatal("etcd not ready within a minute")
	}
	s.e = e
}

// stop stops the server; its data stays in dir.
func (s *server) stop() {
	if s.e != nil {
		s.e.Close()
		s.e = nil
	}
}

// client is a new client of the server, closed at cleanup.
func (s *server) newClient(t *testing.T) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.client}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// ctx is a test's context bounded to a minute.
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return c
}
