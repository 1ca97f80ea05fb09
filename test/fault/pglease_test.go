package fault

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// pgLease runs the replicas on the Postgres lease (lock.backend: postgres).
var pgLease = []string{"OUTBOXD_LOCK_BACKEND=postgres"}

// With lock.backend: postgres, kill -9 of the leader mid-batch: a standby
// takes the lease once it expires on Postgres' clock, and every event is
// delivered, in order per aggregate, none lost (check).
func TestPostgresLeaseKillLeader(t *testing.T) {
	t.Parallel()
	rep := runCaseWith(t, options{env: pgLease, named: true}, func(c *cluster) {
		l := c.leader()
		release := c.hold("deal/3")
		c.waitHeld()
		c.signal(l, syscall.SIGKILL)
		<-c.reps[l].Done()
		release()
		c.leaderOtherThan(l)
	}, nil)
	if rep.tokens < 2 {
		t.Fatal("no takeover after the leader was killed")
	}
}

// With lock.backend: postgres, a SIGTERM hands the lease over: the
// standby leads afterwards, /status names it as the holder (its
// instance_id, as in outbox_leases), and nothing is lost.
func TestPostgresLeaseGracefulHandover(t *testing.T) {
	t.Parallel()
	c := newCluster(t, options{env: pgLease, named: true})
	c.startAll(2)
	l := c.leader()
	c.waitStandby(1 - l)
	if got := c.statusHolder(1 - l); got != instanceID(l) {
		t.Fatalf("standby's /status names holder %q, want %q", got, instanceID(l))
	}
	started := time.Now()
	c.produce()
	c.waitFlowing(started, flowing, 30*time.Second)
	handoverAt := time.Now()
	c.signal(l, syscall.SIGTERM)
	<-c.reps[l].Done()
	if n := c.leaderOtherThan(l); n != 1-l {
		t.Fatalf("replica %d leads, want %d", n, 1-l)
	}
	c.waitFlowing(time.Now(), flowing, 60*time.Second)
	if got := c.statusHolder(1 - l); got != instanceID(1-l) {
		t.Fatalf("after the handover /status names holder %q, want %q", got, instanceID(1-l))
	}
	var instance string
	if err := c.st.Pool().QueryRow(context.Background(),
		`SELECT instance FROM outbox_leases WHERE lock_name = 'lock:outbox:poller' AND expires_at > now()`).Scan(&instance); err != nil || instance != instanceID(1-l) {
		t.Fatalf("outbox_leases holder %q %v, want %q", instance, err, instanceID(1-l))
	}
	if !strings.Contains(c.reps[l].logs(), `"lock released"`) {
		t.Fatalf("the stopped leader did not release its lease:\n%s", tail(c.reps[l].logs(), 20))
	}
	c.stopProducing()
	c.drain(60 * time.Second)
	c.stopAll()
	c.check(handoverAt, nil)
}

// statusHolder is the poller lock's holder that replica i's /status names.
func (c *cluster) statusHolder(i int) string {
	c.t.Helper()
	resp, err := statusClient.Get("http://" + c.reps[i].addr + "/status")
	if err != nil {
		c.t.Fatalf("status of replica %d: %v", i, err)
	}
	defer resp.Body.Close()
	var s struct {
		Locks []struct {
			Name   string `json:"name"`
			Holder string `json:"holder"`
		} `json:"locks"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&s) != nil {
		c.t.Fatalf("status of replica %d: %s", i, resp.Status)
	}
	for _, l := range s.Locks {
		if l.Name == "lock:outbox:poller" {
			return l.Holder
		}
	}
	return ""
}
