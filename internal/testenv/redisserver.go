package testenv

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisServer is a redis-server process of the test's own, on a free
// loopback port, without persistence: for restarts, FLUSHALL, pauses and
// Redlock nodes without touching the shared server.
type RedisServer struct {
	t      testing.TB
	Addr   string
	port   int
	dir    string
	cmd    *exec.Cmd
	exited <-chan struct{} // closed when cmd has exited (its Wait returned)
	extra  []string
}

// StartRedisServer starts one; it is killed at cleanup.
func StartRedisServer(t testing.TB) *RedisServer { return StartRedisServerArgs(t) }

// StartRedisServerArgs starts one with extra redis-server arguments (TLS
// ports, ACL users); the readiness check accepts an auth refusal as "up".
func StartRedisServerArgs(t testing.TB, extra ...string) *RedisServer {
	t.Helper()
	_, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("testenv: redis-server not on PATH (install the redis-server package): %v", err)
	}
	port := FreePort(t)
	s := &RedisServer{t: t, port: port, Addr: "127.0.0.1:" + strconv.Itoa(port), dir: t.TempDir(), extra: extra}
	s.Start()
	t.Cleanup(s.Stop)
	return s
}

// Start (re)starts the process and waits until it answers. A restart
// binds the same port, which another process may hold for a moment (an
// outgoing connection of a parallel test package can be given it once the
// old server is gone): a server that exits with "Address already in use"
// is started again until the deadline, and one that exits for another
// reason fails the test with its log.
func (s *RedisServer) Start() {
	s.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		exited := s.spawn()
		c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
		err := s.await(c, exited, deadline)
		_ = c.Close()
		if err == nil {
			return
		}
		logText, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
		busy := strings.Contains(string(logText), "Address already in use")
		if s.isExited(exited) && busy && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		s.Stop()
		s.t.Fatalf("testenv: redis-server on %s did not answer: %v; its log:\n%s", s.Addr, err, tail(string(logText), 2000))
	}
}

// spawn starts the process; the returned channel is closed when it exits.
func (s *RedisServer) spawn() <-chan struct{} {
	s.t.Helper()
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir,
		"--logfile", filepath.Join(s.dir, "redis.log"))
	cmd.Args = append(cmd.Args, s.extra...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("testenv: start redis-server: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	s.cmd, s.exited = cmd, exited
	return exited
}

// await pings until the server answers (an auth refusal counts as up), it
// exits, or the deadline passes.
func (s *RedisServer) await(c *redis.Client, exited <-chan struct{}, deadline time.Time) error {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil || strings.Contains(fmt.Sprint(err), "NOAUTH") || strings.Contains(fmt.Sprint(err), "WRONGPASS") {
			return nil
		}
		if s.isExited(exited) {
			return fmt.Errorf("the process exited: %w", err)
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *RedisServer) isExited(exited <-chan struct{}) bool {
	select {
	case <-exited:
		return true
	default:
		return false
	}
}

// tail is the last n bytes of text.
func tail(text string, n int) string {
	if len(text) > n {
		return text[len(text)-n:]
	}
	return text
}

// Stop kills the process (data is lost: no persistence).
func (s *RedisServer) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGCONT) // a paused process cannot die of SIGKILL until resumed on some kernels
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
}

// Restart stops and starts the process on the same port: all data is gone.
func (s *RedisServer) Restart() { s.Stop(); s.Start() }

// Pause sends SIGSTOP: connections hang as on a network partition.
func (s *RedisServer) Pause() { s.signal(syscall.SIGSTOP) }

// Resume sends SIGCONT.
func (s *RedisServer) Resume() { s.signal(syscall.SIGCONT) }

func (s *RedisServer) signal(sig syscall.Signal) {
	if s.cmd == nil || s.cmd.Process == nil {
		s.t.Fatalf("testenv: redis-server %s is not running", s.Addr)
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("testenv: signal %v to redis-server: %v", sig, err)
	}
}

// Client returns a client for this server, closed at cleanup.
func (s *RedisServer) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, ContextTimeoutEnabled: true,
		DialTimeout: 500 * time.Millisecond, MaxRetries: 1})
	s.t.Cleanup(func() { _ = c.Close() })
	return c
}

func (s *RedisServer) String() string { return fmt.Sprintf("redis-server %s", s.Addr) }

// FreePort returns a loopback TCP port that was free a moment ago, and
// never the same one twice while this test process runs, in it or in any
// other test process on the host. It is drawn at random from below the
// kernel's ephemeral range (ip_local_port_range): a port from that range,
// closed until its server binds it, may meanwhile become the local port of
// any process' outgoing connection (a Postgres client's), and the server
// then fails to bind (a replica's http.addr, a redis-server). Test
// processes running at once (go test runs packages in parallel) reserve
// their ports with a lock file each (reserve), so one never draws a port
// another drew and has not bound yet.
func FreePort(t testing.TB) int {
	t.Helper()
	lo, hi := portPool()
	for range 1000 {
		port := lo + rand.IntN(hi-lo)
		portsMu.Lock()
		seen := portsGiven[port]
		portsGiven[port] = true
		portsMu.Unlock()
		if seen || !reserve(port) {
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue // taken
		}
		_ = l.Close()
		return port
	}
	t.Fatal("testenv: no free loopback port below the ephemeral range in 1000 tries")
	return 0
}

// portPool is the range FreePort draws from, [lo, hi): from 10000 up to
// the ephemeral range's start (32768 when it cannot be read).
func portPool() (lo, hi int) {
	hi = 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 11000 {
				hi = n
			}
		}
	}
	return 10000, hi
}

// reserve takes port for this process, for as long as it runs: an
// exclusive flock on a file named for it in the system's temporary
// directory, held open and never released (the kernel drops it when the
// process ends, however it ends). It reports false when another process
// holds it.
func reserve(port int) bool {
	dir := filepath.Join(os.TempDir(), "outboxd-test-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return true // no reservation possible here: the bind check alone
	}
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return true
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		return false
	}
	portsMu.Lock()
	portLocks = append(portLocks, f)
	portsMu.Unlock()
	return true
}

var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
	portLocks  []*os.File // reserve's, open until the process ends
)
