package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// PostgresServer is a PostgreSQL instance of the test's own (initdb into a
// temporary directory, a free loopback port), so a test can restart or crash
// it without touching the shared server.
type PostgresServer struct {
	t    testing.TB
	bin  string
	dir  string
	port int
	asPG bool // run the server as the postgres user (we are root)
	// fake is the environment that offsets the server's clock
	// (LD_PRELOAD of libfaketime, FAKETIME); nil: the machine's clock.
	fake []string
	DSN  string
}

// StartPostgresServer creates, starts and (at cleanup) removes an instance.
func StartPostgresServer(t testing.TB) *PostgresServer {
	t.Helper()
	return startPostgresServer(t, nil)
}

// StartPostgresServerClock is StartPostgresServer with the server's clock
// offset from the machine's (libfaketime, Debian's faketime package):
// now(), clock_timestamp() and every default and instant the server
// writes run offset ahead (positive) or behind (negative), while the test
// and the relay keep the machine's clock. The offset is in whole seconds
// and holds across CrashRestart, Stop and Start.
//
// The library is preloaded into pg_ctl, whose server inherits it; not
// through the faketime command, which waits for every process holding its
// pipe, the server included, and so never returns from pg_ctl start.
func StartPostgresServerClock(t testing.TB, offset time.Duration) *PostgresServer {
	t.Helper()
	lib := fakeTimeLib()
	if lib == "" {
		t.Fatal("testenv: libfaketime not found (install the faketime package; scripts/services.sh does)")
	}
	return startPostgresServer(t, []string{"LD_PRELOAD=" + lib, fmt.Sprintf("FAKETIME=%+d", int64(offset/time.Second))})
}

// fakeTimeLib is the path of libfaketime.so.1, "" when it is not installed.
func fakeTimeLib() string {
	for _, pattern := range []string{"/usr/lib/*/faketime/libfaketime.so.1", "/usr/lib/faketime/libfaketime.so.1", "/usr/local/lib/faketime/libfaketime.so.1"} {
		if m, _ := filepath.Glob(pattern); len(m) > 0 {
			return m[0]
		}
	}
	return ""
}

func startPostgresServer(t testing.TB, fake []string) *PostgresServer {
	t.Helper()
	bin := pgBin(t)
	initdb := filepath.Join(bin, "initdb")
	reapOrphanServers(bin)
	dir, err := os.MkdirTemp("", "outboxd-pg-")
	if err != nil {
		t.Fatal(err)
	}
	// The owner's pid lets a later run stop this server if the test binary
	// is killed before its cleanup runs (pg_ctl detaches the server).
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		t.Fatal(err)
	}
	s := &PostgresServer{t: t, bin: bin, dir: dir, port: FreePort(t), asPG: os.Geteuid() == 0, fake: fake}
	if s.asPG {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("testenv: running as root needs a postgres user for initdb: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_ = s.pgctl("stop", "-m", "immediate")
		_ = os.RemoveAll(dir)
	})
	if out, err := s.run(initdb, "-D", filepath.Join(dir, "data"), "-A", "trust", "-U", "postgres", "--no-sync").CombinedOutput(); err != nil {
		t.Fatalf("testenv: initdb: %v\n%s", err, out)
	}
	for attempt := 1; ; attempt++ {
		err := s.pgctl("start")
		if err == nil {
			break
		}
		log, _ := os.ReadFile(filepath.Join(dir, "log"))
		// FreePort's port can be taken by another process before the
		// server binds it (packages and their servers start in parallel).
		if attempt < 3 && strings.Contains(string(log), "could not bind") {
			s.port = FreePort(t)
			continue
		}
		t.Fatalf("%v\nserver log:\n%s", err, log)
	}
	s.DSN = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
	return s
}

// pgBin is the directory of the PostgreSQL server programs.
func pgBin(t testing.TB) string {
	t.Helper()
	if m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb"); len(m) > 0 {
		return filepath.Dir(m[len(m)-1])
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p)
	}
	t.Fatal("testenv: initdb not found (install the postgresql package)")
	return ""
}

// ownerFile holds the pid of the test process that started the server.
const ownerFile = "owner.pid"

// reapOrphanServers stops and removes the private servers of test processes
// that no longer exist (a run killed by a timeout or ^C skips its cleanups),
// so they do not pile up holding memory and ports.
func reapOrphanServers(bin string) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "outboxd-pg-*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue // not ours to judge, or being created
		}
		pid, err := strconv.Atoi(string(b))
		if err != nil || pid <= 0 || syscall.Kill(pid, 0) != syscall.ESRCH {
			continue
		}
		s := &PostgresServer{bin: bin, dir: dir, asPG: os.Geteuid() == 0}
		_ = s.pgctl("stop", "-m", "immediate")
		_ = os.RemoveAll(dir)
	}
}

func (s *PostgresServer) run(name string, args ...string) *exec.Cmd {
	if s.asPG {
		return exec.Command("runuser", append([]string{"-u", "postgres", "--", name}, args...)...)
	}
	return exec.Command(name, args...)
}

func (s *PostgresServer) pgctl(args ...string) error {
	opts := fmt.Sprintf("-p %d -c listen_addresses=127.0.0.1 -k %s -c fsync=off -c full_page_writes=off", s.port, s.dir)
	full := append([]string{"-D", filepath.Join(s.dir, "data"), "-l", filepath.Join(s.dir, "log"), "-w", "-t", "60"}, args...)
	name := filepath.Join(s.bin, "pg_ctl")
	if args[0] == "start" || args[0] == "restart" {
		full = append(full, "-o", opts)
		if s.fake != nil {
			full = append(append(append([]string{}, s.fake...), name), full...)
			name = "env"
		}
	}
	out, err := s.run(name, full...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("testenv: pg_ctl %v: %v\n%s", args, err, out)
	}
	return nil
}

// CrashRestart stops the server without a checkpoint (as a crash would) and
// starts it again; it waits until it accepts connections.
func (s *PostgresServer) CrashRestart() {
	s.t.Helper()
	if err := s.pgctl("restart", "-m", "immediate"); err != nil {
		s.t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := pgx.Connect(ctx, s.DSN)
		cancel()
		if err == nil {
			_ = conn.Close(context.Background())
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("testenv: postgres did not come back: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// LogPath is the server's log file (removed with the server at cleanup):
// a bench that sets log_checkpoints or log_autovacuum_min_duration copies
// it before then.
func (s *PostgresServer) LogPath() string { return filepath.Join(s.dir, "log") }

// Stop shuts the server down cleanly (a checkpoint first), so its data
// directory can be copied.
func (s *PostgresServer) Stop() {
	s.t.Helper()
	if err := s.pgctl("stop", "-m", "fast"); err != nil {
		s.t.Fatal(err)
	}
}

// Start starts a stopped server on its port again.
func (s *PostgresServer) Start() {
	s.t.Helper()
	if err := s.pgctl("start"); err != nil {
		s.t.Fatal(err)
	}
}

// SaveData copies the stopped server's data directory aside as name.
func (s *PostgresServer) SaveData(name string) {
	s.t.Helper()
	if out, err := s.run("cp", "-a", filepath.Join(s.dir, "data"), filepath.Join(s.dir, "copy-"+name)).CombinedOutput(); err != nil {
		s.t.Fatalf("testenv: copy the data directory: %v\n%s", err, out)
	}
}

// RestoreData puts the copy SaveData made back in place of the stopped
// server's data directory: the server goes back in time when started.
func (s *PostgresServer) RestoreData(name string) {
	s.t.Helper()
	data := filepath.Join(s.dir, "data")
	if err := os.RemoveAll(data); err != nil {
		s.t.Fatal(err)
	}
	if out, err := s.run("cp", "-a", filepath.Join(s.dir, "copy-"+name), data).CombinedOutput(); err != nil {
		s.t.Fatalf("testenv: restore the data directory: %v\n%s", err, out)
	}
}
