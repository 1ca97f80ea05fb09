package blackbox

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testkit"
)

// The relay runs Go's collector at GOGC 400 unless GOGC is set, and keeps
// a GOMEMLIMIT it is given; the metrics and the "go collector" log line
// say what is in effect.
func TestTheRelaysCollectorDefaultsAndWhatTheEnvironmentSets(t *testing.T) {
	for _, c := range []struct {
		name           string
		gogc, memlimit string
		metrics        []string
		gogcLog        float64
		source         string
		limitLog       float64
	}{
		{"nothing set", "", "", []string{"\ngo_gc_gogc_percent 400\n"}, 400, "", -1},
		{"GOGC and GOMEMLIMIT set", "150", "256MiB",
			[]string{"\ngo_gc_gogc_percent 150\n", "\ngo_gc_gomemlimit_bytes 2.68435456e+08\n"}, 150, "GOMEMLIMIT", 268435456},
	} {
		t.Run(c.name, func(t *testing.T) {
			rep := setup(t).set("GOGC", c.gogc, "GOMEMLIMIT", c.memlimit).start()
			resp, err := http.Get("http://" + rep.addr + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			for _, m := range c.metrics {
				if !strings.Contains(string(body), m) {
					t.Errorf("metrics lack %q:\n%s", strings.TrimSpace(m), grepLines(string(body), "go_gc_go"))
				}
			}
			logged := rep.logsMatching(func(_ string, rec map[string]any) bool {
				return rec["msg"] == "go collector" && rec["gogc"] == c.gogcLog &&
					(c.source == "" || rec["memory_limit_source"] == c.source) &&
					(c.limitLog < 0 || rec["memory_limit_bytes"] == c.limitLog)
			})
			if len(logged) != 1 {
				t.Errorf("no one \"go collector\" line with gogc %v (source %q); last lines:\n%s", c.gogcLog, c.source, rep.tail(20))
			}
		})
	}
}

// Run in a cgroup with a memory limit (a container's, a systemd unit's
// MemoryMax), the relay sets a soft memory limit of 90% of it. The test
// makes a cgroup of its own (v2 where the memory controller is enabled,
// v1 otherwise), so it needs a writable cgroup filesystem: root, as CI
// runs; elsewhere it is skipped, saying why.
func TestTheRelaysMemoryLimitFollowsItsCgroups(t *testing.T) {
	const limit = 256 << 20
	procs := memoryCgroup(t, limit)
	rep := setup(t).set("GOGC", "", "GOMEMLIMIT", "", "CGROUP_PROCS", procs).
		startVia([]string{"/bin/sh", "-c", `echo $$ > "$CGROUP_PROCS" && exec "$@"`, "sh"})
	want := float64(limit * 9 / 10)
	if len(rep.logsMatching(func(_ string, rec map[string]any) bool {
		return rec["msg"] == "go collector" && rec["gogc"] == float64(400) &&
			rec["memory_limit_source"] == "cgroup" && rec["memory_limit_bytes"] == want
	})) != 1 {
		t.Fatalf("no \"go collector\" line with gogc 400, memory_limit_source cgroup and memory_limit_bytes %.0f; last lines:\n%s", want, rep.tail(20))
	}
}

// memoryCgroup makes a cgroup with a memory limit of limit bytes, removed
// at cleanup (after the processes put in it have ended), and returns its
// cgroup.procs file.
func memoryCgroup(t *testing.T, limit int64) string {
	t.Helper()
	name := fmt.Sprintf("outboxd-test-%d", os.Getpid())
	var dir, file string
	if ctl, err := os.ReadFile("/sys/fs/cgroup/cgroup.subtree_control"); err == nil && slices.Contains(strings.Fields(string(ctl)), "memory") {
		dir, file = filepath.Join("/sys/fs/cgroup", name), "memory.max"
	} else if st, err := os.Stat("/sys/fs/cgroup/memory"); err == nil && st.IsDir() {
		dir, file = filepath.Join("/sys/fs/cgroup/memory", name), "memory.limit_in_bytes"
	} else {
		t.Skip("no cgroup memory controller at /sys/fs/cgroup")
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("cannot make a cgroup of its own (not root?): %v", err)
	}
	t.Cleanup(func() {
		if !testkit.Poll(10*time.Second, func() bool { return os.Remove(dir) == nil }) {
			t.Errorf("cgroup %s not removed", dir)
		}
	})
	if err := os.WriteFile(filepath.Join(dir, file), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "cgroup.procs")
}
