package blackbox

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/internal/testkit"
	"github.com/outboxd/outboxd/store"
)

// Two relays, each with its own postgres.schema and redis.key_prefix, in
// one database: each migrates, relays and fences its own outbox only.
func TestTwoSchemasInOneDatabase(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	base := e.prefix
	received := map[string]*testkit.Receiver{}
	for _, schema := range []string{"orders", "billing"} {
		rc := newRecorder(t, nil)
		received[schema] = rc
		e.set("OUTBOXD_POSTGRES_SCHEMA", schema, "OUTBOXD_REDIS_KEY_PREFIX", base+schema+":",
			"OUTBOXD_DISPATCH_WEBHOOK_URL", rc.URL(), "OUTBOXD_HTTP_ADDR", freeAddr(t))
		if res := runBinary(t, e.vars, time.Minute, "migrate"); res.code != 0 {
			t.Fatalf("migrate %s: %s", schema, res)
		}
		e.start()
	}
	const n = 20
	for _, schema := range []string{"orders", "billing"} {
		var events []store.Event
		for i := range n {
			events = append(events, store.Event{AggregateType: schema, AggregateID: string(rune('a' + i%4)), EventType: "e", Payload: json.RawMessage(`{}`)})
		}
		if err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error { return store.EnqueueIn(ctx, tx, schema, events...) }); err != nil {
			t.Fatal(err)
		}
	}
	stray := e.insert("public", "1", "{}", "") // no relay serves public.outbox

	for schema, rc := range received {
		rc.WaitDelivered(t, time.Minute, n)
		for _, r := range rc.Requests() {
			if r.ID != 0 && !strings.HasPrefix(r.Agg, schema+"/") {
				t.Errorf("the %s relay sent %s's event %d", schema, r.Agg, r.ID)
			}
		}
		pending := func() (n int) {
			if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.outbox WHERE dispatched_at IS NULL`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		testkit.WaitFor(t, time.Minute, schema+"'s rows marked delivered", func() bool { return pending() == 0 },
			func() string { return strconv.Itoa(pending()) + " pending" })
		var fences int
		if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.outbox_fence`).Scan(&fences); err != nil || fences == 0 {
			t.Errorf("%s: %d fence rows (%v), want its own fence", schema, fences, err)
		}
	}
	if w := e.row(stray); w.Dispatched || w.Attempts != 0 {
		t.Errorf("public.outbox's row was touched: %s", w)
	}
	if n := e.count("true"); n != 1 {
		t.Errorf("public.outbox has %d rows, want the stray one", n)
	}
	var fences int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM public.outbox_fence`).Scan(&fences); err != nil || fences != 0 {
		t.Errorf("public.outbox_fence has %d rows (%v), want none", fences, err)
	}
}
