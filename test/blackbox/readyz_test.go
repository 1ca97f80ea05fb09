package blackbox

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// get fetches path on the replica's operations port: status and body.
func (r *replica) get(path string) (int, string) { return r.getWith(path, "") }

// A leader whose every fetch fails (here its table is out of
// reach; in the sweep, a statement_timeout breaking every query) while
// Postgres and Redis answer pings is not ready: /readyz turns 503 after a
// lease period, naming the fetch, /status says why; once fetches succeed
// again it is ready again.
func TestReadyzReflectsFetchFailures(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rc := newRecorder(t, nil)
	e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", rc.URL())
	rep := e.start()
	e.insert("a", "1", `{}`, "")
	rc.WaitDelivered(t, waitTimeout, 1)

	exec := func(sql string) {
		t.Helper()
		if _, err := e.pool.Exec(context.Background(), sql); err != nil {
			t.Fatal(err)
		}
	}
	exec(`ALTER TABLE outbox RENAME TO outbox_away`)
	renamed := true
	t.Cleanup(func() {
		if renamed {
			exec(`ALTER TABLE outbox_away RENAME TO outbox`)
		}
	})
	var body string
	waitFor(t, "/readyz 503 naming the fetch", func() bool {
		var code int
		code, body = rep.get("/readyz")
		return code == http.StatusServiceUnavailable
	}, func() string { return "last /readyz: " + body })
	var checks map[string]string
	if err := json.Unmarshal([]byte(body), &checks); err != nil {
		t.Fatalf("/readyz body %q: %v", body, err)
	}
	if checks["postgres"] != "ok" || checks["redis"] != "ok" || !strings.Contains(checks["fetch"], "outbox") {
		t.Errorf("/readyz: want postgres and redis ok and fetch naming the failure; got %s", body)
	}
	if code, st := rep.get("/status"); !strings.Contains(st, "every fetch of due rows has failed") {
		t.Errorf("/status (%d) does not say the fetch is failing: %s", code, trunc(st, 500))
	}

	exec(`ALTER TABLE outbox_away RENAME TO outbox`)
	renamed = false
	waitFor(t, "/readyz 200 again", func() bool {
		var code int
		code, body = rep.get("/readyz")
		return code == http.StatusOK
	}, func() string { return "last /readyz: " + body })
	e.insert("a", "1", `{}`, "")
	rc.WaitDelivered(t, waitTimeout, 2)
}
