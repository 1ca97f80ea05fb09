package blackbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/internal/testkit"
)

// role creates a login role of the test's own, with no settings of its
// own (roles are the server's: the name is unique), and drops it at
// cleanup with what it owns and was granted in the test's database. It
// returns the role's name and e's DSN logging in as it.
func (e *testBundle) role(kind string) (name, dsn string) {
	e.t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name = "outboxd_" + kind + "_" + hex.EncodeToString(b)
	ident := pgx.Identifier{name}.Sanitize()
	e.exec("CREATE ROLE " + ident + " LOGIN")
	e.t.Cleanup(func() {
		ctx := context.Background()
		if _, err := e.pool.Exec(ctx, "DROP OWNED BY "+ident); err != nil {
			e.t.Logf("drop owned by %s: %v", name, err)
		}
		if _, err := e.pool.Exec(ctx, "DROP ROLE "+ident); err != nil {
			e.t.Logf("drop role %s: %v", name, err)
		}
	})
	u, err := url.Parse(e.dsn)
	if err != nil {
		e.t.Fatal(err)
	}
	u.User = url.User(name)
	return name, u.String()
}

// relayGrants are docs/operations.md's grants ("Roles and grants") of a
// relay role on a schema whose objects exist: data rights only.
func relayGrants(schema, relay string) string {
	s, r := pgx.Identifier{schema}.Sanitize(), pgx.Identifier{relay}.Sanitize()
	return `GRANT USAGE ON SCHEMA ` + s + ` TO ` + r + `;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA ` + s + ` TO ` + r + `;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA ` + s + ` TO ` + r + `;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA ` + s + ` TO ` + r
}

// defaultGrants are what the migration role runs once before `migrate`
// (docs/operations.md, "Roles and grants"): the relay role gets data
// rights on every object migrate creates, now and in later versions.
func defaultGrants(schema, relay string) string {
	s, r := pgx.Identifier{schema}.Sanitize(), pgx.Identifier{relay}.Sanitize()
	return `GRANT USAGE ON SCHEMA ` + s + ` TO ` + r + `;
ALTER DEFAULT PRIVILEGES IN SCHEMA ` + s + ` GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO ` + r + `;
ALTER DEFAULT PRIVILEGES IN SCHEMA ` + s + ` GRANT USAGE, SELECT ON SEQUENCES TO ` + r + `;
ALTER DEFAULT PRIVILEGES IN SCHEMA ` + s + ` GRANT EXECUTE ON FUNCTIONS TO ` + r
}

// `migrate` runs as a migration role that owns outboxd's schema; `run`,
// `reconcile --once`, `pause`, `resume`, `status` and `dead list` as a
// relay role with data rights only, which delivers. poller.notify: true
// cannot create the trigger as that role: the start says who may, and the
// relay polls.
func TestRelayRoleWithoutDDL(t *testing.T) {
	t.Parallel()
	e := setup(t)
	migrator, migrateDSN := e.role("migrate")
	relay, relayDSN := e.role("relay")
	e.exec("CREATE SCHEMA outboxd AUTHORIZATION " + pgx.Identifier{migrator}.Sanitize())
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, migrateDSN)
	if err != nil {
		t.Fatal(err)
	}
	_, err = conn.Exec(ctx, defaultGrants("outboxd", relay))
	_ = conn.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	e.set("OUTBOXD_POSTGRES_SCHEMA", "outboxd", "OUTBOXD_POSTGRES_DSN", migrateDSN)
	if res := runBinary(t, e.vars, time.Minute, "migrate"); res.code != 0 {
		t.Fatalf("migrate as the migration role: %s", res)
	}

	rc := newRecorder(t, nil)
	e.set("OUTBOXD_POSTGRES_DSN", relayDSN, "OUTBOXD_DISPATCH_WEBHOOK_URL", rc.URL(), "OUTBOXD_POLLER_NOTIFY", "true")
	var ids []int64
	for i := range 6 {
		ids = append(ids, e.insertIDs(`INSERT INTO outboxd.outbox (aggregate_type, aggregate_id, event_type, payload)
			VALUES ('acct', $1, 'acct.opened', '{}') RETURNING id`, string(rune('a'+i)))...)
	}
	rep := e.start()
	warned := func(_ string, rec map[string]any) bool {
		s, _ := rec["error"].(string)
		return rec["msg"] == "notify trigger not changed" && strings.Contains(s, "only the owner of outbox")
	}
	if !rep.awaitLog(waitTimeout, warned) {
		t.Errorf("no WARN saying who may create the notify trigger; tail:\n%s", rep.tail(20))
	}
	testkit.WaitFor(t, time.Minute, "every row delivered by the relay role", func() bool {
		return e.countIn("outboxd", "dispatched_at IS NULL") == 0
	}, func() string { return rep.tail(20) })
	ok := rc.OKCounts()
	for _, id := range ids {
		if ok[id] == 0 {
			t.Errorf("event %d never delivered", id)
		}
	}
	for _, args := range [][]string{{"reconcile", "--once"}, {"pause", "default"}, {"resume", "default"}, {"status"}, {"dead", "list"}} {
		if res := runBinary(t, e.vars, time.Minute, args...); res.code != 0 {
			t.Errorf("%v as the relay role: %s", args, res)
		}
	}
}

// countIn counts outbox rows of schema matching where.
func (e *testBundle) countIn(schema, where string) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+pgx.Identifier{schema}.Sanitize()+".outbox WHERE "+where).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}
