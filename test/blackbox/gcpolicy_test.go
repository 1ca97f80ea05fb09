package blackbox

import (
	"io"
	"net/http"
	"strings"
	"testing"
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
