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
	"github.com/outboxd/outboxd/lock/etcdlease"
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

// etcdBinary is the program of an etcd member: Debian's etcd-server,
// which scripts/services.sh installs.
const etcdBinary = "etcd"

// startEtcd starts an n-member etcd cluster, stopped at cleanup. Its
// election timeout is short, so it elects and fails over quickly.
func startEtcd(t *testing.T, n int) []*etcdMember {
	t.Helper()
	if _, err := exec.LookPath(etcdBinary); err != nil {
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

// start runs the member on its ports and data dir; a member restarted
// on its data dir keeps its identity and ignores the --initial-* flags.
func (m *etcdMember) start(t *testing.T) {
	t.Helper()
	var err error
	m.proc, err = testproc.Start(etcdBinary, nil, &m.out, &m.out,
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

// etcdSettings run the replicas on the etcd lease with the shortest
// poller lease etcd takes (config: whole seconds, at least 2 s).
var etcdSettings = []string{
	"OUTBOXD_LOCK_BACKEND=etcd",
	"OUTBOXD_LOCK_ETCD_DIAL_TIMEOUT=2s",
	"OUTBOXD_POLLER_LOCK_TTL=2s",
}

// etcdStart returns a backend.start that starts an n-member etcd cluster
// for c and points the replicas at every member.
func etcdStart(n int) func(c *cluster) []string {
	return func(c *cluster) []string {
		c.etcd = startEtcd(c.t, n)
		eps := make([]string, n)
		for i, m := range c.etcd {
			eps[i] = "http://" + m.client
		}
		return []string{"OUTBOXD_LOCK_ETCD_ENDPOINTS=" + strings.Join(eps, ",")}
	}
}

// etcdHolder reads the etcd lease's lock key (etcdlease's default key
// prefix before the lock's name) through etcd's JSON gateway: its value
// is the holder's instance_id. The key lives on its holder's etcd lease,
// so etcd deletes it when that lease expires.
func etcdHolder(c *cluster, lock string) (string, error) {
	body, err := json.Marshal(map[string][]byte{"key": []byte(etcdlease.DefaultKeyPrefix + lock)})
	if err != nil {
		return "", err
	}
	var errs []error
	for _, m := range c.etcd {
		resp, err := statusClient.Post("http://"+m.client+"/v3/kv/range", "application/json", strings.NewReader(string(body)))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var r struct {
			Kvs []struct {
				Value []byte `json:"value"`
			} `json:"kvs"`
		}
		err = json.NewDecoder(resp.Body).Decode(&r)
		resp.Body.Close()
		switch {
		case resp.StatusCode != http.StatusOK:
			errs = append(errs, fmt.Errorf("%s: range: %s", m.name, resp.Status))
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: range: %w", m.name, err))
		case len(r.Kvs) == 0:
			return "", nil
		default:
			return string(r.Kvs[0].Value), nil
		}
	}
	return "", errors.Join(append(errs, errors.New("no etcd member answered"))...)
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

// etcdRestart stops every member (SIGTERM), leaves etcd down for longer
// than the poller lease, and starts them again on their data dirs: the
// leader cannot renew, so it gives the lock up ("lock lost") at its local
// deadline, and delivery resumes once etcd is back.
var etcdRestart = fault{name: "etcd-restart", do: func(c *cluster) {
	c.leader() // a replica holds the lease when etcd goes
	before := c.countLogs(`"msg":"lock lost"`)
	for _, m := range c.etcd {
		if err := m.proc.Stop(10 * time.Second); errors.Is(err, testproc.ErrStopTimeout) {
			c.t.Fatalf("stop %s: %v", m.name, err)
		}
	}
	time.Sleep(c.pollerTTL() + time.Second) // past the poller lease: the leader must notice
	if c.countLogs(`"msg":"lock lost"`) == before {
		c.t.Errorf("no replica logged \"lock lost\" while etcd was down for longer than the lease:\n%s", c.describe())
	}
	for _, m := range c.etcd {
		m.start(c.t)
	}
	for _, m := range c.etcd {
		m.waitHealthy(c.t)
	}
	c.leader()
}}

// etcdMemberLoss kills (kill -9) the member leading a 3-member etcd
// mid-run: the other two elect another and keep a quorum, and delivery
// goes on over more than a poller lease; then the member rejoins.
var etcdMemberLoss = fault{name: "etcd-member-loss", start: etcdStart(3), do: func(c *cluster) {
	m := c.etcd[etcdLeader(c.t, c.etcd)]
	m.kill()
	c.waitFlowing(time.Now(), flowing, 60*time.Second)
	time.Sleep(c.pollerTTL() + time.Second) // more than a poller lease on two members
	c.waitFlowing(time.Now(), flowing, 60*time.Second)
	m.start(c.t)
	m.waitHealthy(c.t)
}}

// etcdCrash kills every member at once (kill -9) and starts them again
// on what they had written.
var etcdCrash = fault{name: "etcd-kill9-restart", do: func(c *cluster) {
	for _, m := range c.etcd {
		m.kill()
	}
	for _, m := range c.etcd {
		m.start(c.t)
	}
	for _, m := range c.etcd {
		m.waitHealthy(c.t)
	}
}}
