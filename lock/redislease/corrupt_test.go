package redislease_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/lock"
	"github.com/outboxd/outboxd/lock/redislease"
)

const corruptName = "lock:outbox:poller"

// snapshot is what a key holds (DUMP) and its expiry, to prove nothing wrote it.
type snapshot struct {
	dump string
	pttl time.Duration
}

func snap(t *testing.T, rdb *redis.Client, key string) snapshot {
	t.Helper()
	ctx := context.Background()
	dump, err := rdb.Dump(ctx, key).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	pttl := rdb.PTTL(ctx, key).Val()
	if pttl > 0 {
		pttl = time.Hour // a live lease's TTL moves; "has one" is what counts
	}
	return snapshot{dump: dump, pttl: pttl}
}

// wantCorrupt checks err is a corruption report about key on node, and
// nothing else (not "held elsewhere", not an outage, not the wait's end).
func wantCorrupt(t *testing.T, step string, err error, node, key string, fence bool, holds string) {
	t.Helper()
	var ce *lock.CorruptError
	var held *lock.HolderError
	switch {
	case !errors.Is(err, lock.ErrCorrupt) || !errors.As(err, &ce):
		t.Fatalf("%s: got %v, want ErrCorrupt", step, err)
	case errors.Is(err, lock.ErrNotObtained) || errors.As(err, &held):
		t.Fatalf("%s: %v reads as 'not obtained' (held elsewhere or Redis down)", step, err)
	case errors.Is(err, context.DeadlineExceeded):
		t.Fatalf("%s: %v: the wait ran out instead of ending at the first corrupt answer", step, err)
	case ce.Key != key || ce.Node != node || ce.Fence != fence || !strings.Contains(ce.Holds, holds):
		t.Fatalf("%s: %+v, want key %s on %s (fence %t) holding %q", step, ce, key, node, fence, holds)
	case !strings.Contains(err.Error(), key) || !strings.Contains(err.Error(), "delete "+key+":"):
		t.Fatalf("%s: message %q does not name %s and its fix", step, err, key)
	}
}

// A lock key or fence counter holding what the scripts cannot have written
// fails Acquire at once with ErrCorrupt naming the key, writes nothing, and
// is reported by Holder / LastToken; deleting the key repairs it.
func TestCorruptStateIsRefusedBeforeAnyWrite(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		fence bool // the fence counter is the corrupt key, else the lock key
		set   func(ctx context.Context, rdb *redis.Client, key string) error
		holds string // in the error's Holds
	}{
		{"fence abc", true, setString("abc"), `the string "abc"`},
		{"fence hash", true, func(ctx context.Context, rdb *redis.Client, k string) error {
			return rdb.HSet(ctx, k, "token", "7").Err()
		}, "a hash"},
		{"fence list", true, func(ctx context.Context, rdb *redis.Client, k string) error {
			return rdb.RPush(ctx, k, "7").Err()
		}, "a list"},
		{"fence at int64 max", true, setString("9223372036854775807"), `"9223372036854775807"`},
		{"fence beyond int64", true, setString("99999999999999999999"), `"99999999999999999999"`},
		{"fence negative", true, setString("-5"), `"-5"`},
		{"fence plus sign", true, setString("+5"), `"+5"`},
		{"fence decimal", true, setString("5.0"), `"5.0"`},
		{"fence leading zero", true, setString("05"), `"05"`},
		{"fence space", true, setString(" 5"), `" 5"`},
		{"fence empty", true, setString(""), `the string ""`},
		{"fence long binary", true, setString(strings.Repeat("\x00\n", 100)), `\x00\x0a`},
		{"lock hash", false, func(ctx context.Context, rdb *redis.Client, k string) error {
			return rdb.HSet(ctx, k, "owner", "x").Err()
		}, "a hash"},
		{"lock without expiry", false, setString("phantom"), `the string "phantom" with no expiry`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, rdb, _ := newClient(t)
			ctx := context.Background()
			key, fence := c.Key(corruptName), c.FenceKey(corruptName)
			bad := key
			if tc.fence {
				bad = fence
			}
			if err := tc.set(ctx, rdb, bad); err != nil {
				t.Fatal(err)
			}
			before := map[string]snapshot{key: snap(t, rdb, key), fence: snap(t, rdb, fence)}
			const floor = 41
			// A wait far longer than the test: only ending at the first
			// corrupt answer returns in time.
			opts := lock.Options{TTL: 5 * time.Second, Wait: time.Hour, Floor: floor}

			_, err := c.Acquire(ctx, corruptName, opts)
			wantCorrupt(t, "Acquire", err, testenv.RedisAddr(), bad, tc.fence, tc.holds)
			_, err = c.TryAcquire(ctx, corruptName, opts)
			wantCorrupt(t, "TryAcquire", err, testenv.RedisAddr(), bad, tc.fence, tc.holds)
			for k, b := range before {
				if now := snap(t, rdb, k); now != b {
					t.Fatalf("%s changed: %+v, was %+v", k, now, b)
				}
			}

			// /status' readers name the same key.
			_, herr := c.Holder(ctx, corruptName)
			_, lerr := c.LastToken(ctx, corruptName)
			if tc.fence {
				wantCorrupt(t, "LastToken", lerr, testenv.RedisAddr(), bad, true, tc.holds)
				if herr != nil {
					t.Fatalf("Holder with only the counter corrupt: %v", herr)
				}
			} else {
				wantCorrupt(t, "Holder", herr, testenv.RedisAddr(), bad, false, tc.holds)
				if lerr != nil {
					t.Fatalf("LastToken with only the lock key corrupt: %v", lerr)
				}
			}

			// The fix the error states works, and the floor keeps tokens above it.
			if err := rdb.Del(ctx, bad).Err(); err != nil {
				t.Fatal(err)
			}
			l, err := c.Acquire(ctx, corruptName, opts)
			if err != nil {
				t.Fatalf("after deleting %s: %v", bad, err)
			}
			defer release(t, l)
			if l.Token() <= floor {
				t.Fatalf("token %d, want > floor %d", l.Token(), floor)
			}
			if got, err := c.LastToken(ctx, corruptName); err != nil || got != l.Token() {
				t.Fatalf("LastToken after repair: %d, %v; want %d", got, err, l.Token())
			}
		})
	}
}

func setString(v string) func(context.Context, *redis.Client, string) error {
	return func(ctx context.Context, rdb *redis.Client, k string) error { return rdb.Set(ctx, k, v, 0).Err() }
}

// The counter's last valid value issues the largest int64 token exactly (no
// float rounding in the script); the next acquisition is refused, not wrapped.
func TestCounterUpToInt64Max(t *testing.T) {
	t.Parallel()
	c, rdb, _ := newClient(t)
	ctx := context.Background()
	fence := c.FenceKey(corruptName)
	if err := rdb.Set(ctx, fence, "9223372036854775806", 0).Err(); err != nil {
		t.Fatal(err)
	}
	opts := lock.Options{TTL: 5 * time.Second, RenewInterval: -1}
	l, err := c.TryAcquire(ctx, corruptName, opts)
	if err != nil {
		t.Fatal(err)
	}
	if l.Token() != math.MaxInt64 {
		t.Fatalf("token %d, want %d", l.Token(), int64(math.MaxInt64))
	}
	release(t, l)
	_, err = c.TryAcquire(ctx, corruptName, opts)
	wantCorrupt(t, "past int64", err, testenv.RedisAddr(), fence, true, `"9223372036854775807"`)
	// /status says so before anyone tries: the same checks as Acquire.
	_, err = c.LastToken(ctx, corruptName)
	wantCorrupt(t, "LastToken", err, testenv.RedisAddr(), fence, true, `"9223372036854775807"`)
	if _, err := c.TryAcquire(ctx, corruptName, lock.Options{TTL: time.Second, Floor: math.MaxInt64}); err == nil ||
		!strings.Contains(err.Error(), "Floor") {
		t.Fatalf("floor at int64 max: %v, want an error naming Floor", err)
	}
}

// A held lock whose key is overwritten with another type is lost at the next
// renewal (no lease of ours is left), and Release names the key and leaves it.
func TestCorruptedKeyLosesHeldLock(t *testing.T) {
	t.Parallel()
	c, rdb, _ := newClient(t)
	ctx := context.Background()
	key := c.Key(corruptName)
	l, err := c.TryAcquire(ctx, corruptName, lock.Options{TTL: 5 * time.Second, RenewInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.Del(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(ctx, key, "owner", l.Owner()).Err(); err != nil {
		t.Fatal(err)
	}
	err = l.Extend(ctx)
	if !errors.Is(err, lock.ErrLost) || !errors.Is(err, lock.ErrCorrupt) || !strings.Contains(err.Error(), key) {
		t.Fatalf("extend: %v, want ErrLost + ErrCorrupt naming %s", err, key)
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, lock.ErrCorrupt) {
		t.Fatalf("context cause %v, want ErrCorrupt", cause)
	}
	err = l.Release(ctx)
	wantCorrupt(t, "Release", err, testenv.RedisAddr(), key, false, "a hash")
	if v := rdb.HGet(ctx, key, "owner").Val(); v != l.Owner() {
		t.Fatalf("release touched the hash: owner field %q", v)
	}
}

// Redlock: a node with corrupt state counts as a failed node. A minority of
// them still leaves a quorum; a majority ends the wait at once, naming each
// key on each node; a minority plus a holder elsewhere reads as both.
func TestRedlockCorruptNodes(t *testing.T) {
	t.Parallel()
	srvs, nodes := redlockNodes(t, 3)
	c := redislease.New(nodes)
	var clients []*redis.Client
	for _, n := range nodes {
		clients = append(clients, n.(*redis.Client))
	}
	ctx := context.Background()
	key, fence := c.Key(corruptName), c.FenceKey(corruptName)
	addr := func(i int) string { return srvs[i].Addr }
	const floor = 10
	opts := lock.Options{TTL: 5 * time.Second, Wait: time.Hour, Floor: floor, RenewInterval: -1}

	// Minority: node 2's counter is a string.
	if err := clients[2].Set(ctx, fence, "abc", 0).Err(); err != nil {
		t.Fatal(err)
	}
	l, err := c.Acquire(ctx, corruptName, opts)
	if err != nil {
		t.Fatalf("one corrupt node of three: %v", err)
	}
	if l.Token() <= floor {
		t.Fatalf("token %d, want > %d", l.Token(), floor)
	}
	if n := clients[2].Exists(ctx, key).Val(); n != 0 {
		t.Fatal("the lock key was written on the corrupt node")
	}
	// A minority corrupt plus a holder elsewhere: both are said.
	_, err = c.Acquire(ctx, corruptName, lock.Options{TTL: time.Second, Wait: 100 * time.Millisecond})
	var held *lock.HolderError
	if !errors.As(err, &held) || held.Owner != l.Owner() || !errors.Is(err, lock.ErrCorrupt) || !strings.Contains(err.Error(), addr(2)) {
		t.Fatalf("held + one corrupt node: %v, want the holder %s and the corrupt %s named", err, l.Owner(), addr(2))
	}
	release(t, l)
	_, err = c.LastToken(ctx, corruptName)
	wantCorrupt(t, "LastToken", err, addr(2), fence, true, `"abc"`)

	// Majority: node 1's lock key is a list too.
	if err := clients[1].RPush(ctx, key, "x").Err(); err != nil {
		t.Fatal(err)
	}
	before := []snapshot{snap(t, clients[0], key), snap(t, clients[1], key), snap(t, clients[2], fence)}
	_, err = c.Acquire(ctx, corruptName, opts)
	wantCorrupt(t, "two corrupt nodes", err, addr(1), key, false, "a list")
	if !strings.Contains(err.Error(), fence+" on "+addr(2)) {
		t.Fatalf("%v does not name %s on %s", err, fence, addr(2))
	}
	after := []snapshot{snap(t, clients[0], key), snap(t, clients[1], key), snap(t, clients[2], fence)}
	for i := range before {
		if before[i] != after[i] {
			t.Fatalf("key %d changed: %+v, was %+v (node 0's lease must be released)", i, after[i], before[i])
		}
	}
	_, err = c.Holder(ctx, corruptName)
	wantCorrupt(t, "Holder", err, addr(1), key, false, "a list")
}
