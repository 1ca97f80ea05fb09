// Package testproc runs the built outboxd binary as a test's replica: build
// it once, start it with an environment, learn when it ended and how, stop
// it with SIGTERM, wait for /readyz. test/blackbox and test/fault share it,
// so a replica is one idea in one place. Only tests import it.
package testproc

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testenv"
)

// Build builds cmd/outboxd into dir as name, with the race detector when
// race is set, and returns the binary's path.
func Build(dir, name string, race bool) (string, error) {
	bin := filepath.Join(dir, name)
	args := []string{"build", "-o", bin}
	if race {
		args = append(args, "-race")
	}
	out, err := exec.Command("go", append(args, "github.com/outboxd/outboxd/cmd/outboxd")...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("build outboxd: %w\n%s", err, out)
	}
	return bin, nil
}

// FreeAddr is a loopback host:port nothing listens on (testenv.FreePort).
func FreeAddr(t testing.TB) string {
	return "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
}

// Environ is this process' environment without any OUTBOXD_* or OTEL_*
// variable, plus vars: a replica sees only the settings its test gives it
// (an OTEL_* in the caller's shell would turn tracing on).
func Environ(vars map[string]string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OUTBOXD_") && !strings.HasPrefix(kv, "OTEL_") {
			out = append(out, kv)
		}
	}
	for k, v := range vars {
		out = append(out, k+"="+v)
	}
	return out
}

// Process is one running outboxd process. Its methods may be called from
// any goroutine.
type Process struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error // set before done is closed
}

// Start starts bin with args and env; stdout and stderr receive the
// process' output until it ends (exec copies it). A goroutine owned by the
// Process waits for the end: Done is closed then.
func Start(bin string, env []string, stdout, stderr io.Writer, args ...string) (*Process, error) {
	p := &Process{cmd: exec.Command(bin, args...), done: make(chan struct{})}
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = stdout, stderr
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed when the process has ended.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err is how the process ended (nil for exit 0); valid once Done is closed.
func (p *Process) Err() error {
	<-p.done
	return p.err
}

// Signal sends s unless the process has ended.
func (p *Process) Signal(s syscall.Signal) {
	if !p.Exited() {
		_ = p.cmd.Process.Signal(s)
	}
}

// ErrStopTimeout: the process did not end within the limit after SIGTERM
// and was killed.
var ErrStopTimeout = errors.New("did not exit after SIGTERM; killed")

// Stop sends SIGCONT (a paused process must run to act on the next
// signal) and SIGTERM, and waits up to limit for the end; past it, it kills
// the process and returns ErrStopTimeout. Otherwise it returns how the
// process ended (nil for exit 0).
func (p *Process) Stop(limit time.Duration) error {
	p.Signal(syscall.SIGCONT)
	p.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.err
	case <-time.After(limit):
		_ = p.cmd.Process.Kill()
		<-p.done
		return ErrStopTimeout
	}
}

// Ready reports whether /readyz on addr answers 200 within client's timeout.
func Ready(client *http.Client, addr string) bool {
	resp, err := client.Get("http://" + addr + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
