package blackbox

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testenv"
)

// exitLimit is how long a command that must exit by itself may take; `run`
// with a bad setting must refuse at once, not start.
const exitLimit = 10 * time.Second

// cliVars is a valid environment for commands that need no replica.
func cliVars(t *testing.T) map[string]string {
	_, prefix := testenv.Redis(t)
	vars := baseEnv()
	vars["OUTBOXD_POSTGRES_DSN"] = testenv.DSN(t)
	vars["OUTBOXD_REDIS_ADDRS"] = testenv.RedisAddr()
	vars["OUTBOXD_REDIS_KEY_PREFIX"] = prefix
	vars["OUTBOXD_HTTP_ADDR"] = freeAddr(t)
	vars["OUTBOXD_DISPATCH_WEBHOOK_URL"] = "http://127.0.0.1:1/events"
	return vars
}

func with(vars map[string]string, kv ...string) map[string]string {
	out := map[string]string{}
	for k, v := range vars {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

// Invalid settings exit 2 naming the key, for `config`
// and for `run` (which must not start).
func TestBadSettingsExit2NamingTheKey(t *testing.T) {
	t.Parallel()
	empty := filepath.Join(t.TempDir(), "empty-secret")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	vars := cliVars(t)
	for _, tc := range []struct {
		name, key string
		kv        []string
	}{
		{"webhook timeout above half the lock TTL", "dispatch.webhook.timeout",
			[]string{"OUTBOXD_DISPATCH_WEBHOOK_TIMEOUT", "2s", "OUTBOXD_POLLER_LOCK_TTL", "2s"}},
		{"whsec secret not base64", "dispatch.webhook.secret",
			[]string{"OUTBOXD_DISPATCH_WEBHOOK_SECRET", "whsec_!!!notbase64"}},
		{"unparsable DSN", "postgres.dsn",
			[]string{"OUTBOXD_POSTGRES_DSN", "postgres://a b c:%zz@"}},
		{"empty secret file", "dispatch.webhook.secret_file",
			[]string{"OUTBOXD_DISPATCH_WEBHOOK_SECRET_FILE", empty}},
		{"variable of no key, the nearest named", "OUTBOXD_POLLER_BATCH_SIZE",
			[]string{"OUTBOXD_POLER_BATCH_SIZE", "10"}},
		{"notify behind a transaction pooler", "postgres.pooler",
			[]string{"OUTBOXD_POSTGRES_POOLER", "transaction", "OUTBOXD_POLLER_NOTIFY", "true"}},
	} {
		for _, cmd := range []string{"config", "run"} {
			t.Run(tc.name+"/"+cmd, func(t *testing.T) {
				t.Parallel()
				v := with(vars, tc.kv...)
				v["OUTBOXD_HTTP_ADDR"] = freeAddr(t) // parallel runs each need their own
				res := runBinary(t, v, exitLimit, cmd)
				if res.timedOut || res.code != 2 || !strings.Contains(res.stderr, tc.key) {
					t.Errorf("outboxd %s: want exit 2 with stderr naming %s; got %s", cmd, tc.key, res)
				}
			})
		}
	}
}

// `outboxd config` shows no secret of the webhook URL or of
// any DSN spelling (or, if it rejects a DSN, its error shows none).
func TestConfigShowsNoSecrets(t *testing.T) {
	t.Parallel()
	vars := cliVars(t)
	vars["OUTBOXD_DISPATCH_WEBHOOK_URL"] = "http://user:pw-SECRET1@127.0.0.1:1/hook?token=SECRET2&x=1"
	for _, tc := range []struct {
		dsn     string
		secrets []string
	}{
		{"host=127.0.0.1 user=postgres password = SECRET3 dbname=postgres", []string{"SECRET3"}},
		{"host=127.0.0.1 user=postgres password='SEC RET4' dbname=postgres", []string{"SEC RET4", "RET4"}},
		{"host=127.0.0.1 user=postgres sslpassword=SECRET5 dbname=postgres", []string{"SECRET5"}},
		{"postgres://postgres:pa#SECRET6@127.0.0.1:5432/postgres", []string{"SECRET6"}},
	} {
		t.Run(tc.secrets[0], func(t *testing.T) {
			t.Parallel()
			res := runBinary(t, with(vars, "OUTBOXD_POSTGRES_DSN", tc.dsn), exitLimit, "config")
			if res.timedOut || (res.code != 0 && res.code != 2) {
				t.Fatalf("want exit 0 (or 2 rejecting the DSN); got %s", res)
			}
			for _, s := range append(tc.secrets, "SECRET1", "SECRET2") {
				if strings.Contains(res.stdout+res.stderr, s) {
					t.Errorf("output shows %q (exit %d):\n%s%s", s, res.code, res.stdout, res.stderr)
				}
			}
		})
	}
}

// A webhook URL's password and query token appear neither in
// last_error nor in any log line (debug included).
func TestRunLeaksNoURLSecrets(t *testing.T) {
	t.Parallel()
	e := setup(t)
	closed := freeAddr(t) // nothing listens: every attempt fails at connect
	e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", "http://user:pw-SECRET7@"+closed+"/hook?token=SECRET8",
		"OUTBOXD_LOG_LEVEL", "debug", "OUTBOXD_POLLER_MAX_ATTEMPTS", "2")
	id := e.insert("leak", "1", `{}`, "")
	rep := e.start()
	// Dead after two attempts: both the retry and the dead-letter path logged.
	waitFor(t, "the row dead-lettered", func() bool { return e.row(id).Dead }, e.describeRows("true"))

	w := e.row(id)
	for _, s := range []string{"SECRET7", "SECRET8"} {
		if strings.Contains(w.LastError, s) {
			t.Errorf("last_error shows %s: %q", s, w.LastError)
		}
		if leaks := rep.logsMatching(func(line string, _ map[string]any) bool { return strings.Contains(line, s) }); len(leaks) > 0 {
			t.Errorf("%d log line(s) show %s, first: %s", len(leaks), s, trunc(leaks[0], 500))
		}
		if strings.Contains(rep.stderrText(), s) {
			t.Errorf("stderr shows %s: %s", s, rep.stderrText())
		}
	}
}

// `outboxd health` exits 0 against a ready replica on http.addr
// (configured by file or by env) and 1 when nothing listens there.
func TestHealthCommand(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", newRecorder(t, nil).URL())
	rep := e.start()

	file := filepath.Join(t.TempDir(), "outboxd.yaml")
	if err := os.WriteFile(file, []byte("http:\n  addr: "+rep.addr+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if res := runBinary(t, map[string]string{}, exitLimit, "health", "--config", file); res.code != 0 || res.timedOut {
		t.Errorf("health --config (http.addr %s, replica ready): want exit 0; got %s", rep.addr, res)
	}
	if res := runBinary(t, map[string]string{"OUTBOXD_HTTP_ADDR": rep.addr}, exitLimit, "health"); res.code != 0 || res.timedOut {
		t.Errorf("health with OUTBOXD_HTTP_ADDR=%s (replica ready): want exit 0; got %s", rep.addr, res)
	}

	nobody := freeAddr(t)
	if res := runBinary(t, map[string]string{"OUTBOXD_HTTP_ADDR": nobody}, exitLimit, "health"); res.code != 1 || res.timedOut {
		t.Errorf("health with nothing on %s: want exit 1; got %s", nobody, res)
	}
}
