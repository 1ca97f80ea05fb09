package redisstream

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/internal/testenv"
)

// reply is a Redis error reply with the given text, for replies a test
// cannot make a real server give on demand (LOADING, CLUSTERDOWN...).
type reply string

func (r reply) Error() string { return string(r) }
func (reply) RedisError()     {}

// TestClassify: only a malformed command is Permanent; every reply an
// operator or time can fix is retried; each error names the stream key.
func TestClassify(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		reply     string
		permanent bool
		says      string
	}{
		{"WRONGTYPE Operation against a key holding the wrong kind of value", false, "rename or delete"},
		{"OOM command not allowed when used memory > 'maxmemory'.", false, "out of memory"},
		{"READONLY You can't write against a read only replica.", false, "primary"},
		{"LOADING Redis is loading the dataset in memory", false, "LOADING"},
		{"BUSY Redis is busy running a script.", false, "BUSY"},
		{"MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.", false, "MASTERDOWN"},
		{"CLUSTERDOWN The cluster is down", false, "CLUSTERDOWN"},
		{"TRYAGAIN Multiple keys request during rehashing of slot", false, "TRYAGAIN"},
		{"NOPERM User outboxd has no permissions to run the 'xadd' command", false, "+xadd"},
		{"ERR The stream has exhausted the last possible ID, unable to add more items", false, "exhausted"},
		{"ERR unknown command 'XADD', with args beginning with: ", false, "unknown command"},
		{"ERR syntax error", true, "malformed"},
		{"ERR wrong number of arguments for 'xadd' command", true, "malformed"},
		{"ERR value is not an integer or out of range", true, "malformed"},
	} {
		err := classify(reply(tc.reply), "p:outbox.deal", 9)
		if got := dispatch.IsPermanent(err); got != tc.permanent {
			t.Errorf("%q: permanent %v, want %v", tc.reply, got, tc.permanent)
		}
		msg := err.Error()
		for _, s := range []string{`"p:outbox.deal"`, "event 9", tc.says, tc.reply} {
			if !strings.Contains(msg, s) {
				t.Errorf("%q: error %q lacks %q", tc.reply, msg, s)
			}
		}
	}
}

// TestClassifyRealReply: a malformed XADD's real reply from Redis is
// recognised as Permanent (the texts above are Redis' own).
func TestClassifyRealReply(t *testing.T) {
	t.Parallel()
	c, prefix := testenv.Redis(t)
	err := c.Do(context.Background(), "XADD", prefix+"s", "MAXLEN", "~", "many", "*", "f", "v").Err()
	var r redis.Error
	if !errors.As(err, &r) {
		t.Fatalf("XADD with a bad MAXLEN: %v, want an error reply", err)
	}
	if got := classify(r, prefix+"s", 1); !dispatch.IsPermanent(got) {
		t.Errorf("%v: not permanent", got)
	}
}

// TestParseVersion: IDMP from 8.6 on.
func TestParseVersion(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		info string
		text string
		idmp bool
	}{
		{"# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:0\r\n", "7.0.15", false},
		{"redis_version:8.4.2\r\n", "8.4.2", false},
		{"redis_version:8.6.0\r\n", "8.6.0", true},
		{"redis_version:9.0.1\r\n", "9.0.1", true},
		{"redis_version:255.255.255\r\n", "255.255.255", true}, // an unstable build says so
		{"# Server\r\n", "unknown", false},
	} {
		v := parseVersion(tc.info)
		if !v.known || v.text != tc.text || v.idmp() != tc.idmp {
			t.Errorf("%q: %+v idmp %v, want %s idmp %v", tc.info, v, v.idmp(), tc.text, tc.idmp)
		}
	}
}
