package testenv

import (
	"context"
	"net"
	"testing"
	"time"
)

// A restart binds the same port; while another process holds it for a
// moment, Start keeps trying instead of failing the test (CI, 20:24 UTC:
// "redis-server on 127.0.0.1:43911 did not answer" on a restart while
// other packages ran).
func TestRestartWaitsForABusyPort(t *testing.T) {
	s := StartRedisServer(t)
	s.Stop()
	l, err := net.Listen("tcp", s.Addr)
	if err != nil {
		t.Fatal(err)
	}
	released := make(chan struct{})
	go func() { defer close(released); time.Sleep(700 * time.Millisecond); _ = l.Close() }()
	s.Start()
	<-released
	if err := s.Client().Ping(context.Background()).Err(); err != nil {
		t.Fatalf("after the restart: %v", err)
	}
}
