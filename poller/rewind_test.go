package poller

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxd/outboxd/internal/testkit"
	"github.com/outboxd/outboxd/store"
)

// Ids reused under a running relay (rewind.go). The rescan is set to an
// hour, so only the detection can deliver the reused ids within the test.

// produceAs commits one event per aggregate id given, in one transaction,
// through st, and returns their ids in order.
func produceAs(t *testing.T, st *store.Store, aggs ...string) []int64 {
	t.Helper()
	ctx := context.Background()
	var ids []int64
	err := pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error {
		for _, a := range aggs {
			if err := store.Enqueue(ctx, tx, event(a)); err != nil {
				return err
			}
			var id int64
			if err := tx.QueryRow(ctx, `SELECT currval(pg_get_serial_sequence('outbox', 'id'))`).Scan(&id); err != nil {
				return err
			}
			ids = append(ids, id)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// deliveredAs reports whether id was delivered as an event of aggregate
// "deal/"+agg: ids come round again here, so the id alone says nothing.
func (e *testBundle) deliveredAs(id int64, agg string) bool {
	for _, r := range e.rc.Requests() {
		if r.ID == id && r.Agg == "deal/"+agg && r.OK() {
			return true
		}
	}
	return false
}

// waitDeliveredAs waits until every ids[i] was delivered as aggs[i].
func (e *testBundle) waitDeliveredAs(what string, ids []int64, aggs []string) {
	e.t.Helper()
	e.waitFor(what, 20*time.Second, func() bool {
		for i, id := range ids {
			if !e.deliveredAs(id, aggs[i]) {
				return false
			}
		}
		return true
	})
}

// checkOrderOf asserts that the aggregates whose id starts with prefix got
// their events first delivered in id order.
func (e *testBundle) checkOrderOf(prefix string) {
	e.t.Helper()
	var reqs []testkit.Request
	for _, r := range e.rc.Requests() {
		if strings.HasPrefix(r.Agg, "deal/"+prefix) {
			reqs = append(reqs, r)
		}
	}
	if v := testkit.OrderViolations(reqs); len(v) > 0 {
		e.t.Fatalf("order broken: %s", strings.Join(v, "; "))
	}
}

// waitSaved waits until the saved cursor reached id.
func (e *testBundle) waitSaved(st *store.Store, id int64) {
	e.t.Helper()
	e.waitFor(fmt.Sprintf("the cursor saved at %d", id), 20*time.Second, func() bool {
		var c int64
		_ = st.Pool().QueryRow(context.Background(), `SELECT COALESCE(max(cursor), 0) FROM outbox_cursor`).Scan(&c)
		return c >= id
	})
}

// readAfter waits for a read that began after the call: it inserts a row
// with id (above the cursor; the id sequence is left as it is) and waits
// until it is delivered.
func (e *testBundle) readAfter(id int64) {
	e.t.Helper()
	if _, err := e.st.Pool().Exec(context.Background(), `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) OVERRIDING SYSTEM VALUE
		VALUES ($1, 'deal', 'probe', 'deal.funded', '{}')`, id); err != nil {
		e.t.Fatal(err)
	}
	e.waitFor(fmt.Sprintf("a read after the change (row %d delivered)", id), 20*time.Second, func() bool { return e.delivered(id) })
}

func aggs(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, i%2)
	}
	return out
}

// setvalBackUnderARunningRelay runs a relay (rescan an hour away) until it
// delivered 20 rows, deletes the last 10 and moves the id sequence back so
// that the next id is the 11th's again, by setval with isCalled as given.
func setvalBackUnderARunningRelay(t *testing.T, isCalled bool) (*testBundle, *runner, *testkit.Logs, []int64) {
	e := setup(t)
	r, logs := e.loggedRunner(testConfig())
	r.rescanEvery = time.Hour
	e.run(r)
	ids := e.insert(20, 2)
	e.waitAllDispatched(20 * time.Second)
	e.waitSaved(e.st, ids[19])

	ctx := context.Background()
	if _, err := e.st.Pool().Exec(ctx, `DELETE FROM outbox WHERE id > $1`, ids[9]); err != nil {
		t.Fatal(err)
	}
	next := ids[9]
	if !isCalled {
		next = ids[10]
	}
	if _, err := e.st.Pool().Exec(ctx, `SELECT setval(pg_get_serial_sequence('outbox', 'id'), $1, $2)`, next, isCalled); err != nil {
		t.Fatal(err)
	}
	return e, r, logs, ids
}

// setval() back after a DELETE, under a running relay: the new rows, whose
// ids are at or below its cursor, are delivered (without the detection
// only the rescan, an hour away here, would find them), and in id order
// per aggregate with the rows that follow them above the old ids.
func TestSetvalRewindUnderARunningRelay(t *testing.T) {
	e, r, logs, ids := setvalBackUnderARunningRelay(t, true)
	first := aggs("after", 8)
	reused := produceAs(t, e.st, first...)
	if reused[0] != ids[10] {
		t.Fatalf("the first new id is %d, want %d (reused)", reused[0], ids[10])
	}
	e.waitDeliveredAs("the rows with reused ids delivered", reused, first)
	// More of the same aggregates, passing the old ids.
	more := aggs("after", 6)
	above := produceAs(t, e.st, more...)
	e.waitDeliveredAs("the rows after them delivered", above, more)
	e.checkOrderOf("after")

	logs.WaitLine(t, 5*time.Second, `"msg":"outbox id sequence went back (setval): reading from the start"`)
	if got := testutil.ToFloat64(r.m.ReadRestarts.WithLabelValues(restartSequence)); got != 1 {
		t.Errorf("outboxd_read_restarts_total{reason=sequence_rewound} = %v, want 1", got)
	}
}

// waitUp waits until st answers again after its server restarted.
func waitUp(t *testing.T, st *store.Store) {
	t.Helper()
	testkit.WaitFor(t, 30*time.Second, "postgres back", func() bool {
		_, err := st.Pool().Exec(context.Background(), `SELECT 1`)
		return err == nil
	}, nil)
}

// The database goes back in time under a running relay: its data directory
// is copied, the relay delivers more (its cursor moves on), then the copy
// is put back and started on the same port. The relay (same DSN) delivers
// the new rows whose ids it had already passed. It runs as a role with
// table privileges only (no right to read the id sequence): the read must
// work for it, and a new server is still seen.
func TestDatabaseBackInTimeUnderARunningRelay(t *testing.T) {
	e := setup(t)
	pg, super := e.privatePostgres()
	ctx := context.Background()
	if _, err := super.Pool().Exec(ctx, `CREATE ROLE relay LOGIN;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO relay`); err != nil {
		t.Fatal(err)
	}
	var may bool
	if err := super.Pool().QueryRow(ctx, `SELECT has_sequence_privilege('relay', pg_get_serial_sequence('outbox', 'id'), 'SELECT,USAGE')`).Scan(&may); err != nil || may {
		t.Fatalf("the relay role may read the id sequence (%v, %v): the test needs it not to", may, err)
	}
	relaySt, err := store.Open(ctx, strings.Replace(pg.DSN, "postgres@", "relay@", 1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(relaySt.Close)
	if res, err := relaySt.ReadPath().Read(ctx, store.FetchLimits{Rows: 1}, store.ReadPos{}); err != nil || res.SeqLast != -1 || res.Incarnation == "" {
		t.Fatalf("a read as the relay role: sequence %d, incarnation %q, %v; want -1, a name, no error", res.SeqLast, res.Incarnation, err)
	}

	e.st = relaySt
	cfg := testConfig()
	r, logs := e.loggedRunner(cfg)
	e.st = super
	r.rescanEvery = time.Hour
	e.run(r)

	// round produces six rows of prefix, waits until they are delivered
	// and the cursor saved past them, and runs offline with the server
	// stopped.
	round := func(prefix string, offline func()) []int64 {
		names := aggs(prefix, 6)
		ids := produceAs(t, super, names...)
		e.waitDeliveredAs("the "+prefix+" rows delivered", ids, names)
		e.waitSaved(super, ids[len(ids)-1])
		pg.Stop()
		offline()
		pg.Start()
		waitUp(t, super)
		return ids
	}
	round("before", func() { pg.SaveData("then") })
	passed := round("between", func() { pg.RestoreData("then") })

	after := aggs("after", 6)
	reused := produceAs(t, super, after...)
	if reused[0] > passed[len(passed)-1] {
		t.Fatalf("no id reused: the first new id is %d, the relay passed %d", reused[0], passed[len(passed)-1])
	}
	e.waitDeliveredAs("the rows with reused ids delivered", reused, after)
	e.checkOrderOf("after")
	logs.WaitLine(t, 5*time.Second, `"msg":"database server changed (failover, restore or restart): reloading the saved cursor"`)
	if got := testutil.ToFloat64(r.m.ReadRestarts.WithLabelValues(restartIncarnation)); got < 1 {
		t.Errorf("outboxd_read_restarts_total{reason=server_changed} = %v, want at least 1", got)
	}
}

// A batch in flight while the database goes back in time writes its result
// to the restored server, where a new row may have taken the sent row's id:
// that row is not marked delivered by it, and goes out itself.
func TestBatchInFlightAcrossARestoreLeavesTheNewRow(t *testing.T) {
	e := setup(t)
	pg, _ := e.privatePostgres()
	cfg := testConfig()
	cfg.LockTTL = 30 * time.Second // the held send must outlive the restore
	r, _ := e.loggedRunner(cfg)
	r.rescanEvery = time.Hour
	e.run(r)

	before := aggs("before", 2)
	ids := produceAs(t, e.st, before...)
	e.waitDeliveredAs("the first rows delivered", ids, before)
	e.waitSaved(e.st, ids[len(ids)-1])
	pg.Stop()
	pg.SaveData("then")
	pg.Start()
	waitUp(t, e.st)

	release := e.rc.Hold(testkit.HoldAggregate("deal/held"))
	defer release()
	inFlight := produceAs(t, e.st, "held")[0]
	e.rc.WaitHeld(t, 20*time.Second, 1)
	pg.Stop()
	pg.RestoreData("then")
	pg.Start()
	waitUp(t, e.st)
	after := aggs("after", 4)
	reused := produceAs(t, e.st, after...)
	if !slices.Contains(reused, inFlight) {
		t.Fatalf("the restored server handed out %v, not the id in flight (%d)", reused, inFlight)
	}
	release()
	e.waitDeliveredAs("the rows with reused ids delivered", reused, after)
}

// setval() forward with is_called false (as after a bulk load or a move of
// the data: setval(seq, max(id) + 1, false)) hands out no id at or below
// anything read: no restart, no WARN. pg_sequence_last_value() says NULL
// for such a sequence until its next nextval; read as 0, it looked like the
// sequence going back, and the relay warned and started cold.
func TestSetvalForwardNotCalledIsNoRewind(t *testing.T) {
	e := setup(t)
	cfg := testConfig()
	r, logs := e.loggedRunner(cfg)
	r.rescanEvery = time.Hour
	e.run(r)
	ids := e.insert(10, 2)
	e.waitAllDispatched(20 * time.Second)
	e.waitSaved(e.st, ids[9])

	ctx := context.Background()
	if _, err := e.st.Pool().Exec(ctx, `SELECT setval(pg_get_serial_sequence('outbox', 'id'), $1, false)`, ids[9]+1000); err != nil {
		t.Fatal(err)
	}
	// A read sees the sequence before any id is handed out.
	e.readAfter(ids[9] + 1)
	names := aggs("fwd", 4)
	fwd := produceAs(t, e.st, names...)
	if fwd[0] != ids[9]+1000 {
		t.Fatalf("the first new id is %d, want %d", fwd[0], ids[9]+1000)
	}
	e.waitDeliveredAs("the rows after the setval delivered", fwd, names)
	if got := testutil.ToFloat64(r.m.ReadRestarts.WithLabelValues(restartSequence)); got != 0 {
		t.Errorf("outboxd_read_restarts_total{reason=sequence_rewound} = %v after a setval forward, want 0", got)
	}
	for _, l := range logs.Lines() {
		if strings.Contains(l, `"msg":"outbox id sequence went back (setval)`) {
			t.Errorf("WARN for a setval forward: %s", l)
		}
	}
}

// setval() back with is_called false is still seen (at the first id handed
// out after it), and the rows with reused ids are delivered.
func TestSetvalBackNotCalledUnderARunningRelay(t *testing.T) {
	e, r, _, ids := setvalBackUnderARunningRelay(t, false)
	e.readAfter(ids[19] + 1) // a read sees the sequence not called
	names := aggs("back", 6)
	reused := produceAs(t, e.st, names...)
	if reused[0] != ids[10] {
		t.Fatalf("the first new id is %d, want %d (reused)", reused[0], ids[10])
	}
	e.waitDeliveredAs("the rows with reused ids delivered", reused, names)
	e.checkOrderOf("back")
	if got := testutil.ToFloat64(r.m.ReadRestarts.WithLabelValues(restartSequence)); got != 1 {
		t.Errorf("outboxd_read_restarts_total{reason=sequence_rewound} = %v, want 1", got)
	}
}

// A batch in flight whose row fails for good (a 400) while its id goes to
// another row (ids handed out again under the leader: a failover to a
// replica that lagged, a restore, setval; here by hand): the failure is
// not written to the new row, which is read again and sent. By id alone,
// the new row was dead-lettered unsent.
func TestFailedBatchInFlightLeavesTheRowThatTookItsID(t *testing.T) {
	e := setup(t)
	cfg := testConfig()
	cfg.LockTTL = 30 * time.Second // the held send must outlive the swap
	r, _ := e.loggedRunner(cfg)
	r.rescanEvery = time.Hour // only reading again can find the new row in time
	e.rc.SetRespond(testkit.Statuses(map[string]int{"deal/held": 400}))
	release := e.rc.Hold(testkit.HoldAggregate("deal/held"))
	defer release()
	e.run(r)

	id := produceAs(t, e.st, "held")[0]
	e.rc.WaitHeld(t, 20*time.Second, 1)
	ctx := context.Background()
	if _, err := e.st.Pool().Exec(ctx, `DELETE FROM outbox WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.Pool().Exec(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, created_at)
		OVERRIDING SYSTEM VALUE VALUES ($1, 'deal', 'new', 'deal.funded', '{}', now() + interval '1 second')`, id); err != nil {
		t.Fatal(err)
	}
	release()
	e.waitFor("the held row's 400 answered", 20*time.Second, func() bool {
		for _, q := range e.rc.Requests() {
			if q.ID == id && q.Agg == "deal/held" && q.Status == 400 {
				return true
			}
		}
		return false
	})
	var dead bool
	var attempts int
	e.waitFor("the row that took the id delivered", 20*time.Second, func() bool {
		_ = e.st.Pool().QueryRow(ctx, `SELECT dead_at IS NOT NULL, attempts FROM outbox WHERE id = $1`, id).Scan(&dead, &attempts)
		return dead || e.deliveredAs(id, "new")
	})
	if dead || attempts != 0 {
		t.Fatalf("the row that took the id: dead %v, attempts %d; want delivered, never failed (the failure of the row sent before was written to it)", dead, attempts)
	}
}

// A read on another epoch restarts the read state from the saved cursor;
// so does a read on another server after the first; a sequence below the
// highest value seen restarts it cold; a read that agrees stands and
// raises the sequence floor.
func TestEpochWatchJudgesEachRead(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.DiscardHandler)
	cases := []struct {
		name       string
		watch      epochWatch
		res        store.ReadResult
		wantReason string
		wantCold   bool
		wantFloor  int64
	}{
		{name: "first read", watch: newEpochWatch("e1"), res: store.ReadResult{Epoch: "e1", Incarnation: "s1", SeqLast: 10}, wantFloor: 10},
		{name: "new epoch", watch: newEpochWatch("e1"), res: store.ReadResult{Epoch: "e2", Incarnation: "s1", SeqLast: 10}, wantReason: restartEpoch},
		{name: "new server", watch: epochWatch{epoch: "e1", incarnation: "s1", seqFloor: 10},
			res: store.ReadResult{Epoch: "e1", Incarnation: "s2", SeqLast: 10}, wantReason: restartIncarnation, wantFloor: 10},
		{name: "sequence back", watch: epochWatch{epoch: "e1", incarnation: "s1", seqFloor: 10},
			res: store.ReadResult{Epoch: "e1", Incarnation: "s1", SeqLast: 9}, wantReason: restartSequence, wantCold: true, wantFloor: 10},
		{name: "sequence unreadable", watch: epochWatch{epoch: "e1", incarnation: "s1", seqFloor: 10},
			res: store.ReadResult{Epoch: "e1", Incarnation: "s1", SeqLast: -1}, wantFloor: 10},
		{name: "sequence on", watch: epochWatch{epoch: "e1", incarnation: "s1", seqFloor: 10},
			res: store.ReadResult{Epoch: "e1", Incarnation: "s1", SeqLast: 12}, wantFloor: 12},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := tc.watch
			reason, cold := w.idsReused(tc.res, 5, log)
			if reason != tc.wantReason || cold != tc.wantCold || w.seqFloor != tc.wantFloor {
				t.Errorf("idsReused = %q, cold %v, floor %d; want %q, cold %v, floor %d",
					reason, cold, w.seqFloor, tc.wantReason, tc.wantCold, tc.wantFloor)
			}
		})
	}
}
