package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/store"
)

// Complete writes every instant from Postgres's clock (DESIGN "Time"),
// with Postgres an hour ahead of the relay's clock or an hour behind it:
// between Postgres's now() before the write and after it lie the
// delivered row's dispatched_at, the dead row's dead_at, a failure's
// available_at less its delay, and the available_at of a failure whose
// first write Postgres refused (retried at once).
func TestCompleteWritesPostgresClock(t *testing.T) {
	t.Parallel()
	for _, offset := range []time.Duration{time.Hour, -time.Hour} {
		t.Run(fmt.Sprintf("postgres%+ds", int(offset.Seconds())), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			st := testenv.StoreAt(t, testenv.StartPostgresServerClock(t, offset).DSN)
			exec(t, st, `CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
				IF NEW.last_error = 'refused' THEN RAISE EXCEPTION 'refused' USING ERRCODE = '22023'; END IF;
				RETURN NEW; END $$`)
			exec(t, st, `CREATE TRIGGER refuse BEFORE UPDATE ON outbox FOR EACH ROW EXECUTE FUNCTION refuse()`)
			enqueue(t, st, ev("deal", "1", 1), ev("deal", "2", 2), ev("deal", "3", 3), ev("deal", "4", 4))
			ids := rowsOf(t, st, "deal")
			f := store.Fence{Lock: "lock:outbox:poller", Token: 1, Owner: "o"}
			before := pgNow(t, st)
			nd, nf, err := counts(st.ReadPath().Complete(ctx, f, store.Outcomes{Delivered: done(t, st, ids[0]), Failures: []store.Failure{
				{ID: ids[1], Error: "400", Dead: true},
				{ID: ids[2], Error: "503", Delay: 2 * time.Second},
				{ID: ids[3], Error: "refused", Delay: time.Hour},
			}}))
			if err != nil || nd != 1 || nf != 3 {
				t.Fatalf("Complete: delivered %d failed %d, %v; want 1, 3", nd, nf, err)
			}
			after := pgNow(t, st)
			for _, c := range []struct {
				what, column string
				id           int64
				less         time.Duration
			}{
				{"dispatched_at", "dispatched_at", ids[0], 0},
				{"dead_at", "dead_at", ids[1], 0},
				{"available_at less the 2s delay", "available_at", ids[2], 2 * time.Second},
				{"the refused failure's available_at", "available_at", ids[3], 0},
			} {
				var at time.Time
				if err := st.Pool().QueryRow(ctx, `SELECT `+c.column+` FROM outbox WHERE id = $1`, c.id).Scan(&at); err != nil {
					t.Fatal(err)
				}
				if at = at.Add(-c.less); at.Before(before) || at.After(after) {
					t.Errorf("%s is %s, not within Postgres's now() around the write [%s, %s]", c.what,
						at.UTC().Format(time.RFC3339Nano), before.UTC().Format(time.RFC3339Nano), after.UTC().Format(time.RFC3339Nano))
				}
			}
		})
	}
}

// pgNow is Postgres's clock_timestamp().
func pgNow(t *testing.T, st *store.Store) time.Time {
	t.Helper()
	var now time.Time
	if err := st.Pool().QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	return now
}
