package blackbox

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/internal/testkit"
)

// pausedConfig is two webhook destinations at rc, by aggregate type.
func pausedConfig(t *testing.T, url string) string {
	cfg := filepath.Join(t.TempDir(), "pause.yaml")
	if err := os.WriteFile(cfg, []byte(`
dispatch:
  destinations:
    held: {sink: webhook, webhook: {url: "`+url+`", timeout: 1s}}
    flow: {sink: webhook, webhook: {url: "`+url+`", timeout: 1s}}
  routes:
    - {aggregate_type: "held", to: held}
    - {aggregate_type: "flow", to: flow}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// Pause and resume: a paused destination's events stay pending with no
// attempt charged while the other destination flows, across a kill of the
// leader (the next leader reads the pause from Postgres); status shows it;
// an unknown destination exits 2 naming it; resume delivers everything in
// order.
func TestPauseHoldsAcrossALeaderKillAndResumeDeliversInOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rc := newRecorder(t, nil)
	cfg := pausedConfig(t, rc.URL())
	cli := func(args ...string) result {
		return runBinary(t, e.vars, exitLimit, append(args, "--config", cfg)...)
	}

	if res := cli("pause", "nosuch"); res.code != 2 || !strings.Contains(res.stderr, "nosuch") {
		t.Errorf("pause of an unknown destination: want exit 2 naming it; got %s", res)
	}
	first := e.start("--config", cfg)
	e.set("OUTBOXD_HTTP_ADDR", freeAddr(t))
	second := e.start("--config", cfg)
	leader, standby := first, second
	if leads(t, second) {
		leader, standby = second, first
	}
	if res := cli("pause", "held"); res.code != 0 {
		t.Fatalf("pause held: %s", res)
	}
	pausedLog := func(_ string, rec map[string]any) bool {
		return rec["msg"] == "destination paused" && rec["destination"] == "held"
	}
	if !leader.awaitLog(waitTimeout, pausedLog) {
		t.Fatalf("the leader never logged the pause; tail:\n%s", leader.tail(20))
	}
	held := e.insertMany("held", 5, 4)
	e.insertMany("flow", 5, 4)
	waitFor(t, "the other destination's rows delivered", func() bool {
		return e.count(`aggregate_type = 'flow' AND dispatched_at IS NULL`) == 0
	}, e.describeRows("aggregate_type = 'flow' AND dispatched_at IS NULL"))

	untouched := func(when string) {
		t.Helper()
		if n := e.count(`aggregate_type = 'held' AND (dispatched_at IS NOT NULL OR dead_at IS NOT NULL OR attempts > 0)`); n > 0 {
			t.Errorf("%s: %d paused rows sent, dead or charged:\n%s", when, n, e.describeRows("aggregate_type = 'held'")())
		}
		for _, r := range rc.Requests() {
			if strings.HasPrefix(r.Agg, "held/") {
				t.Fatalf("%s: the receiver got paused event %d", when, r.ID)
			}
		}
	}
	untouched("paused")
	res := cli("status", "--json")
	var st struct {
		Destinations []struct {
			Name   string
			Paused bool
		}
	}
	if err := json.Unmarshal([]byte(res.stdout), &st); err != nil {
		t.Fatalf("status --json: %v: %s", err, res)
	}
	for _, d := range st.Destinations {
		if d.Paused != (d.Name == "held") {
			t.Errorf("status --json: %s paused %v", d.Name, d.Paused)
		}
	}
	if res := cli("status"); !strings.Contains(res.stdout, "paused since") {
		t.Errorf("status does not show the paused destination: %s", res)
	}
	if _, m := leader.get("/metrics"); !strings.Contains(m, `outboxd_destination_paused{destination="held"} 1`) ||
		!strings.Contains(m, `outboxd_destination_paused{destination="flow"} 0`) {
		t.Errorf("/metrics lacks outboxd_destination_paused held 1, flow 0")
	}

	leader.kill()
	if !standby.awaitLog(waitTimeout, pausedLog) {
		t.Fatalf("the next leader never logged the pause; tail:\n%s", standby.tail(20))
	}
	e.insertMany("flow", 5, 2)
	waitFor(t, "the next leader delivers the other destination", func() bool {
		return e.count(`aggregate_type = 'flow' AND dispatched_at IS NULL`) == 0
	}, e.describeRows("aggregate_type = 'flow' AND dispatched_at IS NULL"))
	untouched("after the leader's kill")

	if res := cli("resume", "held"); res.code != 0 {
		t.Fatalf("resume held: %s", res)
	}
	waitFor(t, "the paused rows delivered after resume", func() bool {
		return e.count(`aggregate_type = 'held' AND dispatched_at IS NULL`) == 0
	}, e.describeRows("aggregate_type = 'held' AND dispatched_at IS NULL"))
	if v := testkit.OrderViolations(rc.Requests()); len(v) > 0 {
		t.Errorf("order broken: %v", v)
	}
	ok := rc.OKCounts()
	for _, id := range held {
		if ok[id] == 0 {
			t.Errorf("paused event %d not delivered after resume", id)
		}
	}
	if n := e.count(`aggregate_type = 'held' AND attempts > 0`); n > 0 {
		t.Errorf("%d paused rows were charged attempts", n)
	}
}
