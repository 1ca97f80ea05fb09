package testenv

import (
	"os"
	"strings"
	"testing"
)

// scripts/kinesalite.sh installs the kinesalite the tests run: a script
// left on another version would leave InstallKinesalite a binary of that
// version (it installs only what is missing).
func TestKinesaliteScriptInstallsTheVersionTestsRun(t *testing.T) {
	script, err := os.ReadFile("../../scripts/kinesalite.sh")
	if err != nil {
		t.Fatal(err)
	}
	if want := "VERSION=" + KinesaliteVersion + " "; !strings.Contains(string(script), want) {
		t.Fatalf("scripts/kinesalite.sh does not set %q: it would install another kinesalite than KinesaliteVersion", want)
	}
}
