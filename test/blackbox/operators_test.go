package blackbox

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// instance_id names the holder wherever the holder is shown: the lock log
// lines ("holder", beside fencing_token), /status and `outboxd status`.
func TestInstanceIDNamesTheLockHolder(t *testing.T) {
	t.Parallel()
	e := newEnv(t).set("OUTBOXD_INSTANCE_ID", "relay-7", "OUTBOXD_DISPATCH_SINK", "noop")
	rep := e.start()
	holderLine := func(msg string) func(string, map[string]any) bool {
		return func(_ string, rec map[string]any) bool {
			return rec["msg"] == msg && rec["lock"] == "lock:outbox:poller" && rec["holder"] == "relay-7" && rec["fencing_token"] != nil
		}
	}
	if !rep.awaitLog(waitTimeout, holderLine("lock acquired")) {
		t.Fatalf("no lock acquired line with holder relay-7; logs:\n%s", rep.tail(20))
	}
	_, body := rep.get("/status")
	var st struct {
		Locks []struct {
			Name   string `json:"name"`
			Holder string `json:"holder"`
			Owner  string `json:"owner"`
			Token  int64  `json:"token"`
		} `json:"locks"`
	}
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("/status: %v: %s", err, body)
	}
	found := false
	for _, l := range st.Locks {
		if l.Name == "lock:outbox:poller" {
			found = l.Holder == "relay-7" && l.Owner != "" && l.Token > 0
		}
	}
	if !found {
		t.Fatalf("/status: want lock:outbox:poller held by relay-7 with owner and token: %s", body)
	}
	res := runBinary(t, e.vars, 30*time.Second, "status")
	if res.code != 0 || !strings.Contains(res.stdout, "relay-7") {
		t.Fatalf("outboxd status: want the holder relay-7: %s", res)
	}
	rep.stop()
	if len(rep.logsMatching(holderLine("lock released"))) != 1 {
		t.Fatalf("no lock released line with holder relay-7; logs:\n%s", rep.tail(20))
	}
}
