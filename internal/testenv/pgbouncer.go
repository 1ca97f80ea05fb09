package testenv

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// PgBouncer is a PgBouncer of the test's own in front of the test
// Postgres, pooling server sessions per transaction (pool_mode =
// transaction) with its default settings otherwise: the startup
// parameters it does not know are refused. It runs as the postgres user
// when the test runs as root (PgBouncer refuses root) and is stopped at
// cleanup.
type PgBouncer struct {
	Addr string
	cmd  *exec.Cmd
	dir  string
}

// PgBouncerBin is where the Debian package puts PgBouncer.
const PgBouncerBin = "/usr/sbin/pgbouncer"

// StartPgBouncer starts one in front of the server of dsn (testenv.DSN's
// or a PostgresServer's). extra are more lines of its [pgbouncer] section
// ("ignore_startup_parameters = jit").
func StartPgBouncer(t testing.TB, dsn string, extra ...string) *PgBouncer {
	t.Helper()
	if _, err := os.Stat(PgBouncerBin); err != nil {
		t.Fatalf("testenv: %s missing (scripts/services.sh installs it): %v", PgBouncerBin, err)
	}
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "outboxd-pgbouncer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	port := FreePort(t)
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %[4]s/userlist.txt
pool_mode = transaction
max_client_conn = 500
default_pool_size = 20
logfile = %[4]s/pgbouncer.log
pidfile = %[4]s/pgbouncer.pid
%[5]s
`, u.Hostname(), u.Port(), port, dir, strings.Join(extra, "\n"))
	if err := os.WriteFile(filepath.Join(dir, "pgbouncer.ini"), []byte(ini), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "userlist.txt"), []byte(`"postgres" ""`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{PgBouncerBin, filepath.Join(dir, "pgbouncer.ini")}
	if os.Geteuid() == 0 {
		pg, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("testenv: pgbouncer refuses to run as root, and there is no postgres user: %v", err)
		}
		uid, _ := strconv.Atoi(pg.Uid)
		gid, _ := strconv.Atoi(pg.Gid)
		for _, p := range []string{dir, filepath.Join(dir, "pgbouncer.ini"), filepath.Join(dir, "userlist.txt")} {
			if err := os.Chown(p, uid, gid); err != nil {
				t.Fatal(err)
			}
		}
		// setpriv execs pgbouncer in its own process: a kill reaches it.
		args = append([]string{"setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups"}, args...)
	}
	b := &PgBouncer{Addr: "127.0.0.1:" + strconv.Itoa(port), dir: dir, cmd: exec.Command(args[0], args[1:]...)}
	if err := b.cmd.Start(); err != nil {
		t.Fatalf("testenv: start pgbouncer: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = b.cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = b.cmd.Process.Kill()
		<-exited
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", b.Addr, time.Second)
		if err == nil {
			_ = c.Close()
			return b
		}
		select {
		case <-exited:
			t.Fatalf("testenv: pgbouncer exited: %s", b.log())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: pgbouncer on %s did not listen: %v\n%s", b.Addr, err, b.log())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Via is dsn (a URL) pointed at this PgBouncer instead of the server.
func (b *PgBouncer) Via(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		panic(err)
	}
	u.Host = b.Addr
	return u.String()
}

func (b *PgBouncer) log() string {
	text, _ := os.ReadFile(filepath.Join(b.dir, "pgbouncer.log"))
	return tail(string(text), 2000)
}
