package testenv

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// A test process killed before its cleanups leaves its private server
// running; the next StartPostgresServer stops and removes it.
func TestOrphanServerIsReaped(t *testing.T) {
	if os.Getenv("OUTBOXD_TEST_TESTENV_ORPHAN") == "1" {
		s := StartPostgresServer(t)
		os.Stdout.WriteString("dir=" + s.dir + " dsn=" + s.DSN + "\n")
		time.Sleep(time.Hour) // killed by the parent
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestOrphanServerIsReaped$", "-test.v")
	cmd.Env = append(os.Environ(), "OUTBOXD_TEST_TESTENV_ORPHAN=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var dir, dsn string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && strings.HasPrefix(f[0], "dir=") {
			dir, dsn = strings.TrimPrefix(f[0], "dir="), strings.TrimPrefix(f[1], "dsn=")
			break
		}
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if dir == "" {
		t.Fatal("the child printed no server")
	}
	if !alive(dsn) {
		t.Fatal("the orphan server is not running before the reap: the test proves nothing")
	}

	reapOrphanServers(pgBin(t))

	if _, err := os.Stat(filepath.Join(dir, "data")); !os.IsNotExist(err) {
		t.Fatalf("orphan data directory still there (%v)", err)
	}
	if alive(dsn) {
		t.Fatal("orphan server still accepts connections")
	}
}

func alive(dsn string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return false
	}
	_ = c.Close(ctx)
	return true
}
