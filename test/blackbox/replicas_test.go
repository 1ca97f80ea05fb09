package blackbox

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// replicaRow is one entry of status' replicas list.
type replicaRow struct {
	InstanceID string    `json:"instance_id"`
	Role       string    `json:"role"`
	HTTPAddr   string    `json:"http_addr"`
	Version    string    `json:"version"`
	LastSeen   time.Time `json:"last_seen"`
}

// replicasOf reads the replicas list from a status JSON body.
func replicasOf(t *testing.T, body string) map[string]replicaRow {
	t.Helper()
	var st struct {
		Replicas []replicaRow `json:"replicas"`
	}
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("status: %v: %s", err, trunc(body, 500))
	}
	out := map[string]replicaRow{}
	for _, r := range st.Replicas {
		out[r.InstanceID] = r
	}
	return out
}

// Two replicas on one host, each with its own http.addr and instance_id:
// the standby logs `standing by` once, naming the leader's instance_id,
// however long it waits; `outboxd status` (table and --json) and /status
// list both, with which one leads; a replica that stops is no longer
// listed.
func TestTwoReplicasAreListedAndTheStandbySaysWhoLeads(t *testing.T) {
	t.Parallel()
	e := setup(t).set("OUTBOXD_DISPATCH_SINK", "noop", "OUTBOXD_INSTANCE_ID", "relay-a")
	first := e.start()
	waitFor(t, "relay-a leads", func() bool { return leads(t, first) }, func() string { return first.tail(10) })
	e.set("OUTBOXD_INSTANCE_ID", "relay-b", "OUTBOXD_HTTP_ADDR", freeAddr(t))
	second := e.start()

	standing := func(_ string, rec map[string]any) bool { return rec["msg"] == "standing by" }
	if !second.awaitLog(waitTimeout, standing) {
		t.Fatalf("the standby never logged standing by; logs:\n%s", second.tail(20))
	}
	both := func(rs map[string]replicaRow) bool {
		return rs["relay-a"].Role == "leader" && rs["relay-b"].Role == "standby"
	}
	var seen replicaRow
	waitFor(t, "/status lists relay-a leading and relay-b standing by", func() bool {
		_, body := second.get("/status")
		rs := replicasOf(t, body)
		seen = rs["relay-b"]
		return both(rs) && rs["relay-a"].HTTPAddr == first.addr && rs["relay-b"].HTTPAddr == second.addr
	}, func() string { _, body := second.get("/status"); return body })
	// The standby heartbeats again: it has waited for the lock many times
	// over (poller.lock_wait is 300ms), and still said so once.
	waitFor(t, "relay-b's heartbeat seen again", func() bool {
		_, body := first.get("/status")
		return replicasOf(t, body)["relay-b"].LastSeen.After(seen.LastSeen)
	}, func() string { _, body := first.get("/status"); return body })
	lines := second.logsMatching(standing)
	if len(lines) != 1 || !strings.Contains(lines[0], `"holder":"relay-a"`) || !strings.Contains(lines[0], `"lock":"lock:outbox:poller"`) {
		t.Errorf("want one standing by line naming lock:outbox:poller and holder relay-a, got %d:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	if lines := first.logsMatching(standing); len(lines) != 0 {
		t.Errorf("the leader logged standing by:\n%s", strings.Join(lines, "\n"))
	}

	res := runBinary(t, e.vars, 30*time.Second, "status", "--json")
	if rs := replicasOf(t, res.stdout); res.code != 0 || !both(rs) || rs["relay-a"].Version == "" {
		t.Errorf("status --json: want relay-a leader and relay-b standby, with versions: %s", res)
	}
	res = runBinary(t, e.vars, 30*time.Second, "status")
	if res.code != 0 || !strings.Contains(res.stdout, "REPLICA") || !tableRow(res.stdout, "relay-a", "leader", first.addr) ||
		!tableRow(res.stdout, "relay-b", "standby", second.addr) {
		t.Errorf("status: want a replicas table with relay-a leader and relay-b standby: %s", res)
	}

	second.stop()
	_, body := first.get("/status")
	if rs := replicasOf(t, body); len(rs) != 1 || rs["relay-a"].Role != "leader" {
		t.Errorf("after relay-b stopped: want relay-a alone: %s", trunc(body, 800))
	}
}

// tableRow reports whether a line of out holds every field.
func tableRow(out string, fields ...string) bool {
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		ok := true
		for _, want := range fields {
			found := false
			for _, have := range f {
				found = found || have == want
			}
			ok = ok && found
		}
		if ok {
			return true
		}
	}
	return false
}
