package testenv

import (
	"cmp"
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterSlots is the number of hash slots of every Redis Cluster.
const clusterSlots = 16384

// clusterReadyWithin bounds the wait for a new cluster to agree on itself.
const clusterReadyWithin = 30 * time.Second

// StartRedisCluster starts n redis-server processes as a Redis Cluster of n
// masters (no replicas) and returns their addresses once every node says the
// cluster is ok and all nodes agree on who serves each of the 16384 slots.
func StartRedisCluster(t testing.TB, n int) []string {
	t.Helper()
	var addrs []string
	for range n {
		// node-timeout 5 s: a node busy on a loaded test machine is not taken
		// for failed (without replicas that would turn the cluster down).
		// The bus port is a free port of its own, not the default port +
		// 10,000, which may lie in the ephemeral range (FreePort).
		s := StartRedisServerArgs(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "5000", "--cluster-port", strconv.Itoa(FreePort(t)))
		addrs = append(addrs, s.Addr)
	}
	args := append(append([]string{"--cluster", "create"}, addrs...), "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("testenv: redis-cli --cluster create: %v\n%s", err, out)
	}
	waitClusterReady(t, addrs)
	return addrs
}

// waitClusterReady polls every node until none reports a problem. One node
// saying cluster_state:ok is not enough: each node turns ok on its own once
// gossip has told it all slot owners (and, after a failed state, only after a
// rejoin delay), and a key routed to a node still in fail answers CLUSTERDOWN.
func waitClusterReady(t testing.TB, addrs []string) {
	t.Helper()
	clients := make([]*redis.Client, len(addrs))
	for i, a := range addrs {
		clients[i] = redis.NewClient(&redis.Options{Addr: a, MaxRetries: -1})
		defer clients[i].Close()
	}
	deadline := time.Now().Add(clusterReadyWithin)
	for {
		problem := clusterProblem(clients, len(addrs))
		if problem == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: Redis Cluster %s not ready after %s: %s", strings.Join(addrs, ","), clusterReadyWithin, problem)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// clusterProblem says what keeps the cluster from being ready, "" when
// nothing does: every node is ok with all slots served and n known masters,
// and all nodes report the same slot owners.
func clusterProblem(clients []*redis.Client, n int) string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var first string
	for i, c := range clients {
		addr := c.Options().Addr
		info, err := c.ClusterInfo(ctx).Result()
		if err != nil {
			return fmt.Sprintf("%s: CLUSTER INFO: %v", addr, err)
		}
		if p := clusterInfoProblem(info, n); p != "" {
			return addr + " reports " + p
		}
		// CLUSTER SHARDS, not the deprecated CLUSTER SLOTS: we need Redis 7+
		// anyway (scripts/services.sh says so).
		shards, err := c.ClusterShards(ctx).Result()
		if err != nil {
			return fmt.Sprintf("%s: CLUSTER SHARDS: %v", addr, err)
		}
		owners, p := slotOwners(shards)
		if p != "" {
			return addr + ": " + p
		}
		if i == 0 {
			first = owners
		} else if owners != first {
			return fmt.Sprintf("%s and %s disagree on slot owners: %s / %s", clients[0].Options().Addr, addr, first, owners)
		}
	}
	return ""
}

// clusterInfoProblem checks one node's CLUSTER INFO.
func clusterInfoProblem(info string, n int) string {
	fields := map[string]string{}
	for line := range strings.Lines(info) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			fields[k] = v
		}
	}
	want := []struct{ key, value string }{
		{"cluster_state", "ok"},
		{"cluster_slots_assigned", strconv.Itoa(clusterSlots)},
		{"cluster_slots_ok", strconv.Itoa(clusterSlots)},
		{"cluster_known_nodes", strconv.Itoa(n)},
		{"cluster_size", strconv.Itoa(n)},
	}
	for _, w := range want {
		if fields[w.key] != w.value {
			return fmt.Sprintf("%s:%s (want %s)", w.key, fields[w.key], w.value)
		}
	}
	return ""
}

// slotOwners renders CLUSTER SHARDS as "start-end=masterID,..." in slot
// order, and says when the ranges do not cover every slot exactly once or a
// range has no master.
func slotOwners(shards []redis.ClusterShard) (string, string) {
	type owned struct {
		start, end int64
		master     string
	}
	var ranges []owned
	for _, sh := range shards {
		master := shardMaster(sh)
		for _, r := range sh.Slots {
			if master == "" {
				return "", fmt.Sprintf("CLUSTER SHARDS: slots %d-%d have no master", r.Start, r.End)
			}
			ranges = append(ranges, owned{r.Start, r.End, master})
		}
	}
	slices.SortFunc(ranges, func(a, b owned) int { return cmp.Compare(a.start, b.start) })
	var parts []string
	var next int64
	for _, r := range ranges {
		if r.start != next {
			return "", fmt.Sprintf("CLUSTER SHARDS: slot %d unserved", next)
		}
		parts = append(parts, fmt.Sprintf("%d-%d=%s", r.start, r.end, r.master))
		next = r.end + 1
	}
	if next != clusterSlots {
		return "", fmt.Sprintf("CLUSTER SHARDS: slots %d-%d unserved", next, clusterSlots-1)
	}
	return strings.Join(parts, ","), ""
}

// shardMaster is the ID of a shard's master, "" when it has none.
func shardMaster(sh redis.ClusterShard) string {
	for _, n := range sh.Nodes {
		if n.Role == "master" {
			return n.ID
		}
	}
	return ""
}
