package gcpolicy

import (
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"
)

const (
	mib       = 1 << 20
	unlimited = "9223372036854771712" // cgroup v1's "no limit"
)

// tree writes files (path under dir → content) and returns dir.
func tree(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestCgroupLimitIsTheLowestOnThePathToTheProcesssCgroup(t *testing.T) {
	for _, c := range []struct {
		name  string
		files map[string]string // under the fake root; "self" is /proc/self/cgroup
		want  int64             // 0: none found
	}{
		{"v2 container, its own cgroup mounted at the root", map[string]string{
			"self": "0::/\n", "fs/memory.max": "268435456\n"}, 256 * mib},
		{"v2 systemd unit with MemoryMax", map[string]string{
			"self": "0::/system.slice/outboxd.service\n",
			"fs/system.slice/outboxd.service/memory.max": "1073741824\n",
			"fs/system.slice/memory.max":                 "max\n"}, 1024 * mib},
		{"v2 ancestor lower than the unit", map[string]string{
			"self": "0::/system.slice/outboxd.service\n",
			"fs/system.slice/outboxd.service/memory.max": "max\n",
			"fs/system.slice/memory.max":                 "536870912\n"}, 512 * mib},
		{"v1 pod limit above a container without one", map[string]string{
			"self": "12:cpu,cpuacct:/kubepods/pod1/c1\n4:memory:/kubepods/pod1/c1\n",
			"fs/memory/kubepods/pod1/c1/memory.limit_in_bytes": unlimited,
			"fs/memory/kubepods/pod1/memory.limit_in_bytes":    "536870912"}, 512 * mib},
		{"v1 container: its path is not under the mount, its limit at the root", map[string]string{
			"self": "4:memory:/docker/abc\n", "fs/memory/memory.limit_in_bytes": "268435456\n"}, 256 * mib},
		{"v2 without a limit", map[string]string{"self": "0::/user.slice\n", "fs/user.slice/memory.max": "max\n"}, 0},
		{"v1 without a limit", map[string]string{"self": "4:memory:/\n", "fs/memory/memory.limit_in_bytes": unlimited}, 0},
		{"no cgroup filesystem", map[string]string{"self": "0::/\n"}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := tree(t, c.files)
			got, ok := cgroupLimit(filepath.Join(dir, "self"), filepath.Join(dir, "fs"))
			if c.want == 0 && ok {
				t.Fatalf("limit %d found, want none", got)
			}
			if c.want != 0 && (!ok || got != c.want) {
				t.Fatalf("limit %d (found %v), want %d", got, ok, c.want)
			}
		})
	}
	if _, ok := cgroupLimit(filepath.Join(t.TempDir(), "absent"), t.TempDir()); ok {
		t.Fatal("a limit found without /proc/self/cgroup")
	}
}

// runtimeGC reads the GOGC and memory limit in effect, changing neither.
func runtimeGC() (int, int64) {
	pct := debug.SetGCPercent(100)
	debug.SetGCPercent(pct)
	return pct, debug.SetMemoryLimit(-1)
}

func TestApplyLeavesWhatTheEnvironmentSets(t *testing.T) {
	pct0, lim0 := runtimeGC()
	t.Cleanup(func() { debug.SetGCPercent(pct0); debug.SetMemoryLimit(lim0) })
	cg := tree(t, map[string]string{"self": "0::/\n", "fs/memory.max": "1073741824\n"})
	self, root := filepath.Join(cg, "self"), filepath.Join(cg, "fs")
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }

	debug.SetGCPercent(100)
	debug.SetMemoryLimit(math.MaxInt64)
	p := Apply(env(nil), self, root)
	pct, lim := runtimeGC()
	want := Policy{GCPercent: Percent, MemoryLimit: 1024 * mib * 9 / 10, LimitSource: "cgroup"}
	if p != want || pct != Percent || lim != want.MemoryLimit {
		t.Fatalf("nothing set: policy %+v, runtime GOGC %d limit %d; want %+v in effect", p, pct, lim, want)
	}

	debug.SetGCPercent(50)
	debug.SetMemoryLimit(300 * mib)
	p = Apply(env(map[string]string{"GOGC": "50", "GOMEMLIMIT": "300MiB"}), self, root)
	pct, lim = runtimeGC()
	want = Policy{GCPercent: 50, MemoryLimit: 300 * mib, LimitSource: "GOMEMLIMIT"}
	if p != want || pct != 50 || lim != 300*mib {
		t.Fatalf("GOGC and GOMEMLIMIT set: policy %+v, runtime GOGC %d limit %d; want %+v left as they are", p, pct, lim, want)
	}

	debug.SetGCPercent(-1)
	debug.SetMemoryLimit(math.MaxInt64)
	p = Apply(env(map[string]string{"GOGC": "off"}), filepath.Join(cg, "absent"), root)
	if _, lim = runtimeGC(); p.GCPercent != -1 || p.LimitSource != "none" || p.MemoryLimit != 0 || lim != math.MaxInt64 {
		t.Fatalf("GOGC off, no cgroup: policy %+v, runtime limit %d; want GOGC -1 and no limit", p, lim)
	}
}
