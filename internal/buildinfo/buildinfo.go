// Package buildinfo says which build is running: the version and commit
// given at link time, or else what the Go toolchain recorded (the module
// version of `go install pkg@v1.2.3`, the VCS revision of a build in a
// checkout), and the Go version. `outboxd version` prints it and the metric
// outboxd_build_info exports it.
package buildinfo

import (
	"cmp"
	"runtime"
	"runtime/debug"
)

// Set at link time:
//
//	-ldflags "-X github.com/outboxd/outboxd/internal/buildinfo.version=v1.2.3
//	          -X github.com/outboxd/outboxd/internal/buildinfo.commit=0123abc"
var (
	version string
	commit  string
)

// Info describes the running build.
type Info struct {
	Version   string // "dev" when nothing says
	Commit    string // "unknown" when nothing says
	GoVersion string // runtime.Version()
}

// Get returns the running build's Info.
func Get() Info {
	i := Info{Version: version, Commit: commit, GoVersion: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if i.Version == "" && bi.Main.Version != "(devel)" {
			i.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && i.Commit == "" {
				i.Commit = s.Value
			}
		}
	}
	i.Version = cmp.Or(i.Version, "dev")
	i.Commit = cmp.Or(i.Commit, "unknown")
	return i
}
