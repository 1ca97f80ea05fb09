package fault

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testkit"
	"github.com/outboxd/outboxd/internal/testproc"
)

// etcdMember is one etcd-server process of a private cluster on free
// loopback ports, its data in a temp dir that outlives a restart.
type etcdMember struct {
	name, dir    string
	client, peer string // host:port
	cluster      string // --initial-cluster
	proc         *testproc.Process
	out          testkit.Logs
}

// startEtcd starts an n-member etcd cluster (Debian's etcd-server, which
// scripts/services.sh installs), stopped at cleanup. Its election timeout
// is short, so it elects and fails over quickly.
func startEtcd(t *testing.T, n int) []*etcdMember {
	t.Helper()
	if _, err := exec.LookPath("etcd"); err != nil {
		t.Fatalf("etcd not on PATH (scripts/services.sh installs Debian's etcd-server): %v", err)
	}
	ms := make([]*etcdMember, n)
	var peers []string
	for i := range ms {
		ms[i] = &etcdMember{name: fmt.Sprintf("etcd-%d", i), dir: t.TempDir(), client: freeAddr(t), peer: freeAddr(t)}
		peers = append(peers, ms[i].name+"=http://"+ms[i].peer)
	}
	for _, m := range ms {
		m.cluster = strings.Join(peers, ",")
		m.start(t)
	}
	for _, m := range ms {
		m.waitHealthy(t)
	}
	t.Cleanup(func() {
		for _, m := range ms {
			m.kill()
		}
	})
	return ms
}

// start runs the member on its ports and data dir.
func (m *etcdMember) start(t *testing.T) {
	t.Helper()
	var err error
	m.proc, err = testproc.Start("etcd", nil, &m.out, &m.out,
		"--name", m.name, "--data-dir", m.dir,
		"--listen-client-urls", "http://"+m.client, "--advertise-client-urls", "http://"+m.client,
		"--listen-peer-urls", "http://"+m.peer, "--initial-advertise-peer-urls", "http://"+m.peer,
		"--initial-cluster", m.cluster, "--initial-cluster-state", "new", "--initial-cluster-token", "outboxd-fault",
		"--heartbeat-interval", "20", "--election-timeout", "200", "--logger", "zap", "--log-level", "warn")
	if err != nil {
		t.Fatal(err)
	}
}

// waitHealthy waits until the member answers /health with a leader.
func (m *etcdMember) waitHealthy(t *testing.T) {
	t.Helper()
	testkit.WaitFor(t, 30*time.Second, m.name+" healthy", func() bool {
		resp, err := statusClient.Get("http://" + m.client + "/health")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, func() string { return tail(m.out.String(), 10) })
}

// kill ends the member at once (kill -9).
func (m *etcdMember) kill() {
	if m.proc != nil {
		m.proc.Signal(syscall.SIGKILL)
		<-m.proc.Done()
	}
}

// etcdEnv runs the replicas on the etcd lease of members, with the
// shortest poller lease etcd takes.
func etcdEnv(ms []*etcdMember) []string {
	eps := make([]string, len(ms))
	for i, m := range ms {
		eps[i] = "http://" + m.client
	}
	return []string{
		"OUTBOXD_LOCK_BACKEND=etcd",
		"OUTBOXD_LOCK_ETCD_ENDPOINTS=" + strings.Join(eps, ","),
		"OUTBOXD_LOCK_ETCD_DIAL_TIMEOUT=2s",
		"OUTBOXD_POLLER_LOCK_TTL=2s",
	}
}

// firstTokenAfter is when the first delivery with a token above old
// arrived after since (zero when none did).
func firstTokenAfter(reqs []testkit.Request, old int64, since time.Time) time.Time {
	for _, r := range reqs {
		if r.Token > old && r.OK() && r.At.After(since) {
			return r.At
		}
	}
	return time.Time{}
}

// newestToken is the highest token a delivery carried so far.
func newestToken(reqs []testkit.Request) int64 {
	var n int64
	for _, r := range reqs {
		n = max(n, r.Token)
	}
	return n
}

// With lock.backend: etcd, kill -9 of the leader mid-batch: a standby
// takes the lease once etcd expires it, every event is delivered, in
// order per aggregate, none lost. The takeover time is logged.
func TestEtcdLeaseKillLeader(t *testing.T) {
	t.Parallel()
	ms := startEtcd(t, 1)
	c := newCluster(t, options{env: etcdEnv(ms), named: true})
	c.startAll(2)
	l := c.leader()
	started := time.Now()
	c.produce()
	c.waitFlowing(started, flowing, 30*time.Second)
	release := c.hold("deal/3")
	c.waitHeld()
	old := newestToken(c.rc.Requests())
	killAt := time.Now()
	c.signal(l, syscall.SIGKILL)
	<-c.reps[l].Done()
	release()
	if n := c.leaderOtherThan(l); n != 1-l {
		t.Fatalf("replica %d leads, want %d", n, 1-l)
	}
	c.waitFlowing(time.Now(), flowing, 60*time.Second)
	took := firstTokenAfter(c.rc.Requests(), old, killAt).Sub(killAt)
	c.stopProducing()
	c.drain(60 * time.Second)
	c.stopAll()
	rep := c.check(killAt, nil)
	if rep.tokens < 2 {
		t.Fatal("no takeover after the leader was killed")
	}
	t.Logf("etcd lease, kill -9 of the leader (poller lock TTL 2s): first delivery of the new leader %s after the kill", took.Round(time.Millisecond))
}

// With lock.backend: etcd, a SIGTERM hands the lease over: the standby
// leads afterwards, /status names it, the stopped leader released its
// lease, and nothing is lost. The handover time is logged.
func TestEtcdLeaseGracefulHandover(t *testing.T) {
	t.Parallel()
	ms := startEtcd(t, 1)
	c := newCluster(t, options{env: etcdEnv(ms), named: true})
	c.startAll(2)
	l := c.leader()
	c.waitStandby(1 - l)
	if got := c.statusHolder(1 - l); got != instanceID(l) {
		t.Fatalf("standby's /status names holder %q, want %q", got, instanceID(l))
	}
	started := time.Now()
	c.produce()
	c.waitFlowing(started, flowing, 30*time.Second)
	old := newestToken(c.rc.Requests())
	handoverAt := time.Now()
	c.signal(l, syscall.SIGTERM)
	<-c.reps[l].Done()
	exited := time.Now()
	if n := c.leaderOtherThan(l); n != 1-l {
		t.Fatalf("replica %d leads, want %d", n, 1-l)
	}
	c.waitFlowing(time.Now(), flowing, 60*time.Second)
	first := firstTokenAfter(c.rc.Requests(), old, handoverAt)
	if got := c.statusHolder(1 - l); got != instanceID(1-l) {
		t.Fatalf("after the handover /status names holder %q, want %q", got, instanceID(1-l))
	}
	if !strings.Contains(c.reps[l].logs(), `"lock released"`) {
		t.Fatalf("the stopped leader did not release its lease:\n%s", tail(c.reps[l].logs(), 20))
	}
	c.stopProducing()
	c.drain(60 * time.Second)
	c.stopAll()
	c.check(handoverAt, nil)
	if first.IsZero() {
		// The lease had moved before the signal (a loaded machine missed
		// a renewal): there was no handover to time.
		t.Logf("etcd lease, SIGTERM of the leader: no delivery with a token above %d after the signal", old)
		return
	}
	t.Logf("etcd lease, SIGTERM of the leader: the new leader's first delivery %s after the signal; the old leader exited %s after it",
		first.Sub(handoverAt).Round(time.Millisecond), exited.Sub(handoverAt).Round(time.Millisecond))
}

// With lock.backend: etcd, the one etcd member restarts mid-run (SIGTERM,
// a pause, the same data dir): the leader loses its lease or keeps it,
// delivery resumes, and nothing is lost or reordered.
func TestEtcdLeaseServerRestart(t *testing.T) {
	t.Parallel()
	ms := startEtcd(t, 1)
	c := newCluster(t, options{env: etcdEnv(ms), named: true})
	c.startAll(2)
	c.leader()
	started := time.Now()
	c.produce()
	c.waitFlowing(started, flowing, 30*time.Second)
	faultAt := time.Now()
	if err := ms[0].proc.Stop(10 * time.Second); errors.Is(err, testproc.ErrStopTimeout) {
		t.Fatalf("stop etcd: %v", err)
	}
	time.Sleep(3 * time.Second) // past the poller lease: the leader must notice
	ms[0].start(t)
	ms[0].waitHealthy(t)
	c.leader()
	c.waitFlowing(time.Now(), flowing, 60*time.Second)
	c.stopProducing()
	c.drain(60 * time.Second)
	c.stopAll()
	rep := c.check(faultAt, nil)
	lost := 0
	for _, r := range c.reps {
		lost += strings.Count(r.logs(), `"lock lost"`)
	}
	if lost == 0 {
		t.Errorf("no replica logged \"lock lost\" while etcd was down for longer than the lease")
	}
	t.Logf("etcd restarted: %d leaders, %d lost leases", rep.tokens, lost)
}

// etcdLeader is the index of the member that leads the etcd cluster.
func etcdLeader(t *testing.T, ms []*etcdMember) int {
	t.Helper()
	found := -1
	testkit.WaitFor(t, 30*time.Second, "an etcd leader", func() bool {
		for i, m := range ms {
			resp, err := statusClient.Post("http://"+m.client+"/v3/maintenance/status", "application/json", strings.NewReader("{}"))
			if err != nil {
				continue
			}
			var s struct {
				Header struct {
					MemberID string `json:"member_id"`
				} `json:"header"`
				Leader string `json:"leader"`
			}
			err = json.NewDecoder(resp.Body).Decode(&s)
			resp.Body.Close()
			if err == nil && s.Leader != "" && s.Leader == s.Header.MemberID {
				found = i
				return true
			}
		}
		return false
	}, func() string { return "no member says it leads" })
	return found
}

// With lock.backend: etcd on a 3-member cluster, the etcd leader is killed
// (kill -9) mid-run: the other two elect another and keep a quorum,
// delivery goes on, and nothing is lost or reordered.
func TestEtcdLeaseClusterLosesMember(t *testing.T) {
	t.Parallel()
	ms := startEtcd(t, 3)
	c := newCluster(t, options{env: etcdEnv(ms), named: true})
	c.startAll(2)
	c.leader()
	started := time.Now()
	c.produce()
	c.waitFlowing(started, flowing, 30*time.Second)
	faultAt := time.Now()
	ms[etcdLeader(t, ms)].kill()
	c.waitFlowing(time.Now(), flowing, 60*time.Second)
	time.Sleep(3 * time.Second) // more than a poller lease on two members
	c.waitFlowing(time.Now(), flowing, 60*time.Second)
	c.stopProducing()
	c.drain(60 * time.Second)
	c.stopAll()
	rep := c.check(faultAt, nil)
	t.Logf("3-member etcd losing one member: %d leaders over the run", rep.tokens)
}
