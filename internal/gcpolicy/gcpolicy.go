// Package gcpolicy sets the Go collector's defaults for the relay: a
// higher GOGC than Go's 100, and, in a memory-limited cgroup (a container,
// a systemd unit with MemoryMax), a soft memory limit below the cgroup's,
// so the heap the higher GOGC allows never crowds the process out of it.
// What the environment sets (GOGC, GOMEMLIMIT) is left as it is.
package gcpolicy

import (
	"bufio"
	"bytes"
	"math"
	"os"
	"path"
	"path/filepath"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
)

// Percent is the GOGC the relay runs with unless GOGC is set. The relay
// allocates a few kB per event and keeps little of it, so at Go's 100 the
// collector runs every few batches; at 400 it runs a quarter as often, for
// a larger heap (BENCHMARKS.md measures both).
const Percent = 400

// limitShare is the part of the cgroup's memory limit the soft memory limit
// takes: the rest is the binary, stacks and what the runtime has not yet
// returned.
const limitShare = 0.9

// Policy is what Apply put in effect.
type Policy struct {
	GCPercent   int    // GOGC in effect
	MemoryLimit int64  // soft memory limit in bytes, 0 for none
	LimitSource string // "GOMEMLIMIT", "cgroup" or "none"
}

// Apply sets GOGC to Percent unless getenv("GOGC") is set, and, unless
// getenv("GOMEMLIMIT") is set, a soft memory limit of 90% of the lowest
// memory limit of the process's cgroup and its ancestors: procCgroup is
// /proc/self/cgroup, root the cgroup filesystem (/sys/fs/cgroup), v2
// (memory.max) or v1 (memory/memory.limit_in_bytes). Without a limit
// found there is none.
func Apply(getenv func(string) string, procCgroup, root string) Policy {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(Percent)
	}
	source := "none"
	if getenv("GOMEMLIMIT") != "" {
		source = "GOMEMLIMIT"
	} else if limit, ok := cgroupLimit(procCgroup, root); ok {
		debug.SetMemoryLimit(int64(float64(limit) * limitShare))
		source = "cgroup"
	}
	return inEffect(source)
}

// inEffect is the collector's settings as the runtime holds them, the
// memory limit's from source.
func inEffect(source string) Policy {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}, {Name: "/gc/gomemlimit:bytes"}}
	metrics.Read(s)
	p := Policy{GCPercent: int(int64(s[0].Value.Uint64())), LimitSource: source} // off reads as -1
	if l := s[1].Value.Uint64(); l < math.MaxInt64 {
		p.MemoryLimit = int64(l)
	}
	return p
}

// cgroupLimit is the lowest memory limit set on the process's cgroup or
// an ancestor, as /proc/self/cgroup names it under root; in a container
// that mounts its own cgroup at root, root's own limit too.
func cgroupLimit(procCgroup, root string) (int64, bool) {
	raw, err := os.ReadFile(procCgroup)
	if err != nil {
		return 0, false
	}
	best, found := int64(math.MaxInt64), false
	note := func(file string) {
		if v, ok := readLimit(file); ok && v < best {
			best, found = v, true
		}
	}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		// hierarchy-ID:controllers:path; v2 is "0::path".
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		dir, file := "", ""
		switch {
		case parts[0] == "0" && parts[1] == "":
			dir, file = root, "memory.max"
		case hasController(parts[1], "memory"):
			dir, file = filepath.Join(root, "memory"), "memory.limit_in_bytes"
		default:
			continue
		}
		for p := path.Clean("/" + parts[2]); ; p = path.Dir(p) {
			note(filepath.Join(dir, p, file))
			if p == "/" {
				break
			}
		}
	}
	return best, found
}

func hasController(list, name string) bool {
	for c := range strings.SplitSeq(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// readLimit reads a cgroup memory limit file: a byte count, or "max" (v2)
// or a count near the int64 maximum (v1) for none.
func readLimit(file string) (int64, bool) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return 0, false
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
	if err != nil || v <= 0 || v >= math.MaxInt64/2 {
		return 0, false
	}
	return v, true
}
