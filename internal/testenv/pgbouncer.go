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
	Addr   string
	cmd    *exec.Cmd
	dir    string
	exited chan struct{} // closed when the process ended
}

// PgBouncerBin is where the Debian package puts PgBouncer.
const PgBouncerBin = "/usr/sbin/pgbouncer"

// StartPgBouncer starts one in front of the server of dsn (testenv.DSN's
// or a PostgresServer's), stopped at cleanup. extra are more lines of its
// [pgbouncer] section ("ignore_startup_parameters = jit").
func StartPgBouncer(t testing.TB, dsn string, extra ...string) *PgBouncer {
	t.Helper()
	b, err := RunPgBouncer(dsn, FreePort(t), extra...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	return b
}

// StartPgBouncerFor is StartPgBouncer letting users log in as well as
// postgres (PgBouncer's auth_file names every user it lets in).
func StartPgBouncerFor(t testing.TB, dsn string, users []string, extra ...string) *PgBouncer {
	t.Helper()
	b, err := runPgBouncer(dsn, FreePort(t), users, extra)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	return b
}

// RunPgBouncer starts one on port in front of the server of dsn and waits
// until it listens. Stop it with Stop.
func RunPgBouncer(dsn string, port int, extra ...string) (*PgBouncer, error) {
	return runPgBouncer(dsn, port, nil, extra)
}

func runPgBouncer(dsn string, port int, users, extra []string) (*PgBouncer, error) {
	if _, err := os.Stat(PgBouncerBin); err != nil {
		return nil, fmt.Errorf("testenv: %s missing (scripts/services.sh installs it): %w", PgBouncerBin, err)
	}
	u, err := url.Parse(dsn)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "outboxd-pgbouncer-")
	if err != nil {
		return nil, err
	}
	b := &PgBouncer{Addr: "127.0.0.1:" + strconv.Itoa(port), dir: dir, exited: make(chan struct{})}
	args, err := b.configure(u, port, users, extra)
	if err == nil {
		b.cmd = exec.Command(args[0], args[1:]...)
		err = b.cmd.Start()
	}
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("testenv: start pgbouncer: %w", err)
	}
	go func() { _ = b.cmd.Wait(); close(b.exited) }()
	if err := b.awaitListen(); err != nil {
		b.Stop()
		return nil, err
	}
	return b, nil
}

// configure writes the ini and user list into b.dir and returns the
// command that runs PgBouncer on them: as the postgres user when this
// process is root, which PgBouncer refuses.
func (b *PgBouncer) configure(u *url.URL, port int, users, extra []string) ([]string, error) {
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
`, u.Hostname(), u.Port(), port, b.dir, strings.Join(extra, "\n"))
	files := []string{filepath.Join(b.dir, "pgbouncer.ini"), filepath.Join(b.dir, "userlist.txt")}
	if err := os.WriteFile(files[0], []byte(ini), 0o644); err != nil {
		return nil, err
	}
	list := `"postgres" ""` + "\n"
	for _, u := range users {
		list += `"` + u + `" ""` + "\n"
	}
	if err := os.WriteFile(files[1], []byte(list), 0o644); err != nil {
		return nil, err
	}
	args := []string{PgBouncerBin, files[0]}
	if os.Geteuid() != 0 {
		return args, nil
	}
	pg, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgbouncer refuses to run as root, and there is no postgres user: %w", err)
	}
	uid, _ := strconv.Atoi(pg.Uid)
	gid, _ := strconv.Atoi(pg.Gid)
	for _, p := range append([]string{b.dir}, files...) {
		if err := os.Chown(p, uid, gid); err != nil {
			return nil, err
		}
	}
	// setpriv execs pgbouncer in its own process: a kill reaches it.
	return append([]string{"setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups"}, args...), nil
}

// awaitListen waits until b accepts connections, or its process ended.
func (b *PgBouncer) awaitListen() error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", b.Addr, time.Second)
		if err == nil {
			_ = c.Close()
			return nil
		}
		select {
		case <-b.exited:
			return fmt.Errorf("testenv: pgbouncer exited: %s", b.log())
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testenv: pgbouncer on %s did not listen: %w\n%s", b.Addr, err, b.log())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop kills PgBouncer, waits for it and removes its files.
func (b *PgBouncer) Stop() {
	_ = b.cmd.Process.Kill()
	<-b.exited
	_ = os.RemoveAll(b.dir)
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
