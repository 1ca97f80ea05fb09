package testkit

import (
	"bytes"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// Logs collects log output written from many goroutines and splits it into
// lines. A test waits for a line with WaitLine (woken by each new line, not
// by a timer) rather than sleeping. The zero value is ready to use; it is
// an io.Writer for slog handlers and exec.Cmd's Stdout and Stderr.
type Logs struct {
	mu      sync.Mutex
	lines   []string
	partial []byte        // the last line, until its newline arrives
	changed chan struct{} // closed, then replaced, when lines are added
}

// Write adds p; each newline ends a line.
func (l *Logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, p...)
	added := false
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		l.lines = append(l.lines, string(l.partial[:i]))
		l.partial = l.partial[i+1:]
		added = true
	}
	if len(l.partial) == 0 {
		l.partial = nil // let the consumed bytes go
	}
	if added && l.changed != nil {
		close(l.changed)
		l.changed = nil
	}
	return len(p), nil
}

// String is everything written so far, as written.
func (l *Logs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for _, line := range l.lines {
		b.WriteString(line)
		b.WriteByte('\n')
	}
	b.Write(l.partial)
	return b.String()
}

// Lines returns the lines so far, the unfinished last one included.
func (l *Logs) Lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := append([]string(nil), l.lines...)
	if len(l.partial) > 0 {
		out = append(out, string(l.partial))
	}
	return out
}

// Count is how many lines contain substr.
func (l *Logs) Count(substr string) int {
	n := 0
	for _, line := range l.Lines() {
		if strings.Contains(line, substr) {
			n++
		}
	}
	return n
}

// Tail is the last n lines, for failure messages.
func (l *Logs) Tail(n int) string {
	lines := l.Lines()
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// Await waits up to limit until n complete lines match, looking at each
// line once, and returns the matching lines seen and whether there were n.
func (l *Logs) Await(limit time.Duration, n int, match func(line string) bool) ([]string, bool) {
	timer := time.NewTimer(limit)
	defer timer.Stop()
	var found []string
	next := 0 // the first line not yet looked at
	for {
		l.mu.Lock()
		for ; next < len(l.lines) && len(found) < n; next++ {
			if match(l.lines[next]) {
				found = append(found, l.lines[next])
			}
		}
		if len(found) >= n {
			l.mu.Unlock()
			return found, true
		}
		if l.changed == nil {
			l.changed = make(chan struct{})
		}
		changed := l.changed
		l.mu.Unlock()
		select {
		case <-changed:
		case <-timer.C:
			return found, false
		}
	}
}

// WaitLines waits until n lines match, failing the test after limit with
// what it waited for and the last lines; it returns the matching lines.
func (l *Logs) WaitLines(t testing.TB, limit time.Duration, what string, n int, match func(line string) bool) []string {
	t.Helper()
	found, ok := l.Await(limit, n, match)
	if !ok {
		t.Fatalf("after %s, %d of %d lines for %s; last lines:\n%s", limit, len(found), n, what, l.Tail(20))
	}
	return found
}

// WaitLine waits for one line containing substr and returns it.
func (l *Logs) WaitLine(t testing.TB, limit time.Duration, substr string) string {
	t.Helper()
	return l.WaitLines(t, limit, "a line with "+substr, 1, func(line string) bool { return strings.Contains(line, substr) })[0]
}

// Writer returns a writer that passes each line to t.Log. Lines written
// once t and its cleanups are over are dropped: a goroutine that outlives
// the test must not panic it with a late t.Log.
func Writer(t testing.TB) io.Writer {
	w := &tWriter{t: t}
	// Registered first, so it runs after the cleanups registered later
	// (those that stop what is logging).
	t.Cleanup(func() {
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	return w
}

type tWriter struct {
	mu   sync.Mutex
	t    testing.TB
	done bool
}

func (w *tWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

// Logger returns a JSON slog logger at level Info writing to Writer(t), so
// a component's logs appear with the test's output when it fails (or -v).
func Logger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewJSONHandler(Writer(t), &slog.HandlerOptions{Level: slog.LevelInfo}))
}
