package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

// The Dockerfile's -X flags name variables that exist: a binary linked
// with them, as the image is, reports that version and commit. (A -X
// flag naming a missing variable is silently ignored by the linker.)
func TestDockerfileLinkerFlagsSetTheVersion(t *testing.T) {
	t.Parallel()
	df, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	flags := regexp.MustCompile(`-X (\S+)=\$\{(VERSION|COMMIT)\}`).FindAllStringSubmatch(string(df), -1)
	if len(flags) != 2 {
		t.Fatalf("the Dockerfile sets %d of VERSION and COMMIT with -X, want both: %q", len(flags), flags)
	}
	values := map[string]string{"VERSION": "v9.9.9-test", "COMMIT": "c0ffee"}
	var ldflags []string
	for _, f := range flags {
		ldflags = append(ldflags, "-X", f[1]+"="+values[f[2]])
	}
	bin := filepath.Join(t.TempDir(), "outboxd")
	if out, err := exec.Command("go", "build", "-ldflags", strings.Join(ldflags, " "), "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	if want := "outboxd v9.9.9-test (commit c0ffee, " + runtime.Version() + ")\n"; err != nil || string(out) != want {
		t.Fatalf("version printed %q (%v), want %q", out, err, want)
	}
}
