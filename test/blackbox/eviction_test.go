package blackbox

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/outboxd/outboxd/internal/testenv"
)

// A lock node whose maxmemory-policy is not noeviction is named in a WARN at
// start (its policy and address), in every mode: one node, each Redlock
// node, each cluster master. A node with noeviction, or one that refuses
// CONFIG GET (managed Redis), gets none, and the relay starts either way.
func TestEvictingLockRedisIsWarnedAbout(t *testing.T) {
	t.Parallel()
	evicting := func(t *testing.T, policy string) string {
		return testenv.StartRedisServerArgs(t, "--maxmemory", "64mb", "--maxmemory-policy", policy).Addr
	}
	plain := func(t *testing.T) string { return testenv.StartRedisServer(t).Addr }
	for _, tc := range []struct {
		name string
		mode string
		// addrs returns redis.addrs and the address a WARN must name ("" for none).
		addrs  func(t *testing.T) (addrs []string, warned string)
		policy string
	}{
		{"single volatile-ttl", "single", func(t *testing.T) ([]string, string) {
			a := evicting(t, "volatile-ttl")
			return []string{a}, a
		}, "volatile-ttl"},
		{"single noeviction", "single", func(t *testing.T) ([]string, string) { return []string{plain(t)}, "" }, ""},
		{"single, CONFIG refused", "single", func(t *testing.T) ([]string, string) {
			return []string{testenv.StartRedisServerArgs(t, "--maxmemory-policy", "allkeys-lru", "--rename-command", "CONFIG", "").Addr}, ""
		}, ""},
		{"redlock, one node volatile-lru", "redlock", func(t *testing.T) ([]string, string) {
			a := evicting(t, "volatile-lru")
			return []string{plain(t), a, plain(t)}, a
		}, "volatile-lru"},
		{"cluster, one master allkeys-lru", "cluster", func(t *testing.T) ([]string, string) {
			addrs := testenv.StartRedisCluster(t, 3)
			c := redis.NewClient(&redis.Options{Addr: addrs[1]})
			defer c.Close()
			if err := c.ConfigSet(context.Background(), "maxmemory-policy", "allkeys-lru").Err(); err != nil {
				t.Fatal(err)
			}
			return addrs, addrs[1]
		}, "allkeys-lru"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			addrs, warned := tc.addrs(t)
			e := setup(t)
			e.set("OUTBOXD_DISPATCH_SINK", "noop", "OUTBOXD_LOG_LEVEL", "debug",
				"OUTBOXD_REDIS_MODE", tc.mode, "OUTBOXD_REDIS_ADDRS", strings.Join(addrs, ","))
			r := e.start()
			// Every node's check ends in a line: a WARN, or a DEBUG saying it
			// was checked or could not be.
			checked := func(_ string, rec map[string]any) bool {
				switch rec["msg"] {
				case "redis may evict the lock: maxmemory-policy is not noeviction", "redis maxmemory-policy checked", "redis maxmemory-policy not checked":
					return true
				}
				return false
			}
			want := len(addrs)
			if _, ok := r.out.Await(waitTimeout, want, func(l string) bool { return matchRecord(l, checked) }); !ok {
				t.Fatalf("fewer than %d policy check lines within %s; logs:\n%s", want, waitTimeout, r.tail(30))
			}
			warns := r.logsMatching(func(_ string, rec map[string]any) bool {
				return rec["level"] == "WARN" && rec["msg"] == "redis may evict the lock: maxmemory-policy is not noeviction"
			})
			if warned == "" {
				if len(warns) != 0 {
					t.Fatalf("WARN for a lock Redis that does not evict: %q", warns)
				}
				return
			}
			if len(warns) != 1 || !strings.Contains(warns[0], `"policy":"`+tc.policy+`"`) || !strings.Contains(warns[0], `"redis_addr":"`+warned+`"`) {
				t.Fatalf("want one WARN naming policy %s and node %s, got %q", tc.policy, warned, warns)
			}
		})
	}
}
