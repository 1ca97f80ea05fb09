package store_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/store"
)

// Whatever a row holds (any created_at Postgres accepts, infinities
// included; any attempts; any names), the repair sweep reads it without an
// error, and a failure written back counts attempts from 0 up to the
// largest int, never failing the write.
func FuzzPendingRowsAndAttempts(f *testing.F) {
	st, _ := testenv.Store(f)
	ctx := context.Background()
	fence := store.Fence{Lock: "fuzz", Token: 1, Owner: "fuzz"}
	f.Add(int64(1_700_000_000_000_000), uint8(0), int32(0), "deal", "42", "deal.funded")
	f.Add(int64(0), uint8(1), int32(-5), "", "", "")
	f.Add(int64(0), uint8(2), int32(math.MinInt32), "a", "b", "c")
	f.Add(int64(-1), uint8(0), int32(math.MaxInt32), "ü", "\u2028", "x.y")
	f.Fuzz(func(t *testing.T, createdUS int64, inf uint8, attempts int32, typ, agg, ev string) {
		created := any(time.UnixMicro(createdUS))
		switch inf % 3 {
		case 1:
			created = "infinity"
		case 2:
			created = "-infinity"
		}
		var id int64
		err := st.Pool().QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at, attempts)
			VALUES ($1, $2, $3, '{}', $4::text::timestamptz, $5) RETURNING id`, typ, agg, ev, textOf(created), attempts).Scan(&id)
		if err != nil {
			t.Skipf("Postgres refused the row: %v", err) // NUL, invalid UTF-8, a time out of range
		}
		rows, err := st.Reconcile().PendingRows(ctx, id-1, 1)
		if err != nil || len(rows) != 1 {
			t.Fatalf("PendingRows: %d rows, %v", len(rows), err)
		}
		r := rows[0]
		if r.ID != id || r.AggregateType != typ || r.AggregateID != agg || r.EventType != ev || r.Finite != (inf%3 == 0) {
			t.Fatalf("read back %+v for %q/%q/%q created %v", r, typ, agg, ev, created)
		}
		if r.Finite && r.CreatedAt.UnixMicro() != createdUS {
			t.Fatalf("created_at %v, want %d µs", r.CreatedAt, createdUS)
		}
		if _, n, err := counts(st.ReadPath().Complete(ctx, fence, store.Outcomes{Failures: []store.Failure{{ID: id, Error: "boom", Delay: 0}}})); err != nil || n != 1 {
			t.Fatalf("Complete: %d rows, %v", n, err)
		}
		var got int32
		if err := st.Pool().QueryRow(ctx, `SELECT attempts FROM outbox WHERE id = $1`, id).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if want := int32(min(max(int64(attempts), 0)+1, math.MaxInt32)); got != want {
			t.Fatalf("attempts %d after one failure, was %d; want %d", got, attempts, want)
		}
		if _, err := st.Pool().Exec(ctx, `DELETE FROM outbox WHERE id = $1`, id); err != nil {
			t.Fatal(err)
		}
	})
}

// textOf renders a created_at for Postgres: RFC 3339 with microseconds, or
// the infinity it names.
func textOf(v any) string {
	if t, ok := v.(time.Time); ok {
		return t.UTC().Format("2006-01-02T15:04:05.999999Z07:00")
	}
	return v.(string)
}
