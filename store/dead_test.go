package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/store"
)

// deadRow is a row inserted dead-lettered (or not, when deadAt is zero).
type deadRow struct {
	aggType, aggID, eventType, lastError string
	deadAt                               time.Time
	delivered                            bool
}

// replayFence is the fence replays carry in these tests (a term of
// lock:reconciliation; nothing else writes under that lock here).
var replayFence = store.Fence{Lock: "lock:reconciliation", Token: 1, Owner: "test-replay"}

// insertRows writes rows and returns their ids, in order.
func insertRows(t *testing.T, st *store.Store, rows ...deadRow) []int64 {
	t.Helper()
	ids := make([]int64, len(rows))
	for i, r := range rows {
		var dead, delivered *time.Time
		if !r.deadAt.IsZero() {
			dead = &r.deadAt
		}
		if r.delivered {
			now := time.Now()
			delivered = &now
		}
		err := st.Pool().QueryRow(context.Background(), `INSERT INTO outbox
			(aggregate_type, aggregate_id, event_type, payload, headers, attempts, last_error, dead_at, dispatched_at)
			VALUES ($1, $2, $3, jsonb_build_object('n', $4::int), '{"traceparent":"00-t"}', 3, NULLIF($5, ''), $6, $7)
			RETURNING id`, r.aggType, r.aggID, r.eventType, i, r.lastError, dead, delivered).Scan(&ids[i])
		if err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

// listAll pages through the list limit rows at a time and returns the ids
// in the order served, failing on a page larger than limit.
func listAll(t *testing.T, st *store.Store, f store.DeadFilter, limit int) []int64 {
	t.Helper()
	var out []int64
	var after *store.DeadCursor
	for pages := 0; ; pages++ {
		if pages > 10000 {
			t.Fatal("the list never ends")
		}
		page, err := st.Ops().ListDead(context.Background(), store.DeadQuery{Filter: f, After: after, Limit: limit})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Events) > limit {
			t.Fatalf("page of %d rows, limit %d", len(page.Events), limit)
		}
		for _, e := range page.Events {
			out = append(out, e.ID)
		}
		if page.Next == "" {
			return out
		}
		c, err := store.ParseDeadCursor(page.Next)
		if err != nil {
			t.Fatal(err)
		}
		after = &c
	}
}

func TestDeadListFilters(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	t0 := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
	ids := insertRows(t, st,
		deadRow{"deal", "1", "deal.funded", "receiver answered 500: TIMEOUT upstream", t0, false},                 // 0
		deadRow{"deal", "2", "deal.closed", "Über-Fehler: Straße gesperrt ✓", t0.Add(time.Minute), false},         // 1
		deadRow{"deal", "12", "deal_funded", "100% of 1_000 failed \\ backslash", t0.Add(2 * time.Minute), false}, // 2
		deadRow{"payment", "1", "payment.funded", "tab\there\nnewline", t0.Add(3 * time.Minute), false},           // 3
		deadRow{"payment", "1", "pay*ment", "", t0.Add(4 * time.Minute), false},                                   // 4: last_error NULL
		deadRow{"deal", "1", "deal.funded", "pending, not dead", time.Time{}, false},                              // 5
		deadRow{"deal", "1", "deal.funded", "delivered", time.Time{}, true},                                       // 6
	)
	var ctype string
	if err := st.Pool().QueryRow(context.Background(), `SHOW lc_ctype`).Scan(&ctype); err != nil {
		t.Fatal(err)
	}
	want := func(is ...int) []int64 {
		out := []int64{}
		for _, i := range is {
			out = append(out, ids[i])
		}
		slices.Reverse(out) // newest first
		return out
	}
	cases := []struct {
		name string
		f    store.DeadFilter
		want []int64
	}{
		{"all", store.DeadFilter{}, want(0, 1, 2, 3, 4)},
		{"aggregate type", store.DeadFilter{AggregateType: "deal"}, want(0, 1, 2)},
		{"aggregate", store.DeadFilter{AggregateType: "deal", AggregateID: "1"}, want(0)},
		{"aggregate of another type", store.DeadFilter{AggregateType: "payment", AggregateID: "1"}, want(3, 4)},
		{"event type exact", store.DeadFilter{EventType: "deal.funded"}, want(0)},
		{"event type _ is literal", store.DeadFilter{EventType: "deal_funded"}, want(2)},
		{"event type glob *", store.DeadFilter{EventType: "deal*"}, want(0, 1, 2)},
		{"event type glob ?", store.DeadFilter{EventType: "deal?funded"}, want(0, 2)},
		{"event type glob in the middle", store.DeadFilter{EventType: "*.funded"}, want(0, 3)},
		{"event type glob, _ is literal", store.DeadFilter{EventType: "deal_*"}, want(2)},
		{"event type glob, % is literal", store.DeadFilter{EventType: "pay%*"}, want()},
		{"event type glob, an escaped backslash is literal", store.DeadFilter{EventType: `*\\`}, want()},
		{"event type escaped *", store.DeadFilter{EventType: `pay\*ment`}, want(4)},
		{"event type escaped * with a glob", store.DeadFilter{EventType: `pay\*m*`}, want(4)},
		{"since is inclusive", store.DeadFilter{Since: t0.Add(time.Minute)}, want(1, 2, 3, 4)},
		{"until is exclusive", store.DeadFilter{Until: t0.Add(2 * time.Minute)}, want(0, 1)},
		{"since and until", store.DeadFilter{Since: t0.Add(time.Minute), Until: t0.Add(3 * time.Minute)}, want(1, 2)},
		{"error, other case", store.DeadFilter{Error: "timeout"}, want(0)},
		{"error, UTF-8 as written", store.DeadFilter{Error: "Straße gesperrt ✓"}, want(1)},
		{"error, % and _ are literal", store.DeadFilter{Error: "100% of 1_"}, want(2)},
		{"error, % alone matches only a %", store.DeadFilter{Error: "%"}, want(2)},
		{"error, backslash", store.DeadFilter{Error: `\ back`}, want(2)},
		{"error, control characters", store.DeadFilter{Error: "tab\there\n"}, want(3)},
		{"error matches nothing", store.DeadFilter{Error: "no such text"}, want()},
		{"ids", store.DeadFilter{IDs: []int64{ids[1], ids[5], ids[6]}}, want(1)},
		{"combined", store.DeadFilter{AggregateType: "deal", EventType: "deal.*", Error: "e"}, want(0, 1)},
	}
	if ctype != "C" && ctype != "POSIX" {
		cases = append(cases, struct {
			name string
			f    store.DeadFilter
			want []int64
		}{"error, UTF-8 in another case (lc_ctype " + ctype + ")", store.DeadFilter{Error: "ÜBER-FEHLER: STRASSE"}, want()},
			struct {
				name string
				f    store.DeadFilter
				want []int64
			}{"error, UTF-8 upper case (lc_ctype " + ctype + ")", store.DeadFilter{Error: "ÜBER-FEHLER: STRAßE"}, want(1)})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, limit := range []int{1, 2, 50} {
				if got := listAll(t, st, tc.f, limit); !slices.Equal(got, tc.want) {
					t.Errorf("limit %d: ids %v, want %v", limit, got, tc.want)
				}
			}
			n, err := st.Ops().CountDead(context.Background(), tc.f)
			if err != nil || n != int64(len(tc.want)) {
				t.Errorf("CountDead = %d, %v; want %d", n, err, len(tc.want))
			}
		})
	}
}

// Rows that share a dead_at (a batch dead-lettered at once) page without
// repeats or gaps, newest first, and a row dead-lettered while an operator
// pages does not shift the pages after the cursor.
func TestDeadListPagesStablyOverEqualDeadAt(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	t0 := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
	var rows []deadRow
	for i := range 23 {
		at := t0
		if i%4 == 0 {
			at = t0.Add(time.Duration(i) * time.Second) // a few apart, the rest share t0
		}
		rows = append(rows, deadRow{"deal", fmt.Sprint(i), "deal.funded", "e", at, false})
	}
	ids := insertRows(t, st, rows...)
	// Expected order: dead_at descending, then id descending.
	type key struct {
		at time.Time
		id int64
	}
	var keys []key
	for i, r := range rows {
		keys = append(keys, key{r.deadAt, ids[i]})
	}
	slices.SortFunc(keys, func(a, b key) int {
		if c := b.at.Compare(a.at); c != 0 {
			return c
		}
		return int(b.id - a.id)
	})
	var want []int64
	for _, k := range keys {
		want = append(want, k.id)
	}

	for _, limit := range []int{1, 3, 5, 22, 23, 24} {
		if got := listAll(t, st, store.DeadFilter{}, limit); !slices.Equal(got, want) {
			t.Errorf("limit %d: %v, want %v", limit, got, want)
		}
	}

	// Page once, then dead-letter a newer row and an equal one with a higher
	// id: the following pages are exactly the rest of the first listing.
	ctx := context.Background()
	first, err := st.Ops().ListDead(ctx, store.DeadQuery{Filter: store.DeadFilter{}, After: nil, Limit: 7})
	if err != nil || len(first.Events) != 7 || first.Next == "" {
		t.Fatalf("first page: %d rows, next %q, %v", len(first.Events), first.Next, err)
	}
	insertRows(t, st, deadRow{"deal", "new", "deal.funded", "e", t0.Add(time.Hour), false},
		deadRow{"deal", "tie", "deal.funded", "e", t0, false})
	c, err := store.ParseDeadCursor(first.Next)
	if err != nil {
		t.Fatal(err)
	}
	rest, err := st.Ops().ListDead(ctx, store.DeadQuery{Filter: store.DeadFilter{}, After: &c, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	var got []int64
	for _, e := range append(first.Events, rest.Events...) {
		got = append(got, e.ID)
	}
	if !slices.Equal(got, want) || rest.Next != "" {
		t.Errorf("pages around new dead rows: %v (next %q), want %v", got, rest.Next, want)
	}
}

func TestDeadCursorRoundTrips(t *testing.T) {
	t.Parallel()
	for _, c := range []store.DeadCursor{
		{DeadAt: pgtype.Timestamptz{Time: time.Date(2026, 11, 20, 12, 0, 0, 123456000, time.UTC), Valid: true}, ID: 42},
		{DeadAt: pgtype.Timestamptz{Time: time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC), Valid: true}, ID: -3},
		{DeadAt: pgtype.Timestamptz{InfinityModifier: pgtype.Infinity, Valid: true}, ID: 7},
		{DeadAt: pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}, ID: 7},
	} {
		got, err := store.ParseDeadCursor(c.String())
		if err != nil || got.ID != c.ID || got.DeadAt.InfinityModifier != c.DeadAt.InfinityModifier ||
			!got.DeadAt.Time.Equal(c.DeadAt.Time) {
			t.Errorf("%s: parsed %+v, %v; want %+v", c, got, err, c)
		}
	}
	for _, bad := range []string{"", "42", "x.1", "1.x", "1.2.3", "infinity.", "1e3.4"} {
		if _, err := store.ParseDeadCursor(bad); err == nil {
			t.Errorf("ParseDeadCursor(%q): no error", bad)
		}
	}
}

// Rows with infinite timestamps (dead-lettered for them) list and show;
// the cursor passes an infinite dead_at (set by hand).
func TestDeadRowsWithInfiniteTimestamps(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	ids := insertRows(t, st, deadRow{"a", "1", "e", "x", time.Now(), false}, deadRow{"a", "2", "e", "x", time.Now(), false},
		deadRow{"a", "3", "e", "x", time.Now(), false})
	if _, err := st.Pool().Exec(ctx, `UPDATE outbox SET available_at = 'infinity', created_at = '-infinity' WHERE id = $1;`, ids[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Pool().Exec(ctx, `UPDATE outbox SET dead_at = 'infinity' WHERE id = $1`, ids[1]); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Pool().Exec(ctx, `UPDATE outbox SET dead_at = '-infinity' WHERE id = $1`, ids[2]); err != nil {
		t.Fatal(err)
	}
	if got := listAll(t, st, store.DeadFilter{}, 1); !slices.Equal(got, []int64{ids[1], ids[0], ids[2]}) {
		t.Errorf("list: %v, want %v", got, []int64{ids[1], ids[0], ids[2]})
	}
	e, err := st.Ops().ShowDead(ctx, ids[0])
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(e)
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil || got["created_at"] != "-infinity" || got["available_at"] != "infinity" {
		t.Errorf("show: %s, %v; want created_at -infinity, available_at infinity", b, err)
	}
	// Replay passes them all (its cursor starts below -infinity).
	if n, err := st.Reconcile().ReplayDead(ctx, replayFence, store.Replay{Filter: store.ReplayFilter{}, BatchSize: 1, Progress: nil}); err != nil || n != 3 {
		t.Errorf("replay: %d, %v; want 3", n, err)
	}
}

func TestShowDead(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	ids := insertRows(t, st, deadRow{"deal", "1", "deal.funded", "boom", time.Now(), false},
		deadRow{"deal", "1", "deal.funded", "", time.Time{}, false}, deadRow{"deal", "1", "deal.funded", "", time.Time{}, true})
	e, err := st.Ops().ShowDead(ctx, ids[0])
	if err != nil {
		t.Fatal(err)
	}
	if e.ID != ids[0] || e.LastError != "boom" || e.Attempts != 3 || string(e.Payload) != `{"n": 0}` ||
		string(e.Headers) != `{"traceparent": "00-t"}` || !e.DeadAt.Valid || !e.CreatedAt.Valid || !e.AvailableAt.Valid {
		t.Errorf("show: %+v (payload %s headers %s)", e, e.Payload, e.Headers)
	}
	for _, tc := range []struct {
		id   int64
		want error
		says string
	}{{ids[1], store.ErrNotDead, "pending"}, {ids[2], store.ErrNotDead, "delivered"}, {ids[2] + 100, store.ErrNoRow, "id"}} {
		_, err := st.Ops().ShowDead(ctx, tc.id)
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("show %d: %v, want %v saying %q", tc.id, err, tc.want, tc.says)
		}
	}
}

// A filtered replay requeues exactly what CountDead (the dry run) counted,
// and nothing else.
func TestReplayFollowsTheFilter(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	t0 := time.Now().Add(-time.Hour)
	var rows []deadRow
	for i := range 30 {
		et := "deal.closed"
		if i%3 == 0 {
			et = "deal.funded"
		}
		rows = append(rows, deadRow{"deal", fmt.Sprint(i % 4), et, fmt.Sprintf("attempt %d: HTTP 503", i), t0.Add(time.Duration(i%5) * time.Minute), false})
	}
	ids := insertRows(t, st, rows...)
	f := store.ReplayFilter{EventType: "*.funded", Since: t0.Add(time.Minute), Error: "http 5"}
	var want []int64
	for i, r := range rows {
		if r.eventType == "deal.funded" && !r.deadAt.Before(f.Since) {
			want = append(want, ids[i])
		}
	}
	dry, err := st.Ops().CountDead(ctx, f)
	if err != nil || dry != int64(len(want)) || len(want) == 0 {
		t.Fatalf("dry run: %d, %v; want %d (> 0)", dry, err, len(want))
	}
	n, err := st.Reconcile().ReplayDead(ctx, replayFence, store.Replay{Filter: f, BatchSize: 2, Progress: nil})
	if err != nil || n != dry {
		t.Fatalf("replay: %d, %v; want %d", n, err, dry)
	}
	left := listAll(t, st, store.DeadFilter{}, 100)
	for _, id := range ids {
		if slices.Contains(want, id) == slices.Contains(left, id) {
			t.Errorf("row %d: replayed %t, still dead %t", id, slices.Contains(want, id), slices.Contains(left, id))
		}
	}
	if n, _ := st.Ops().CountDead(ctx, f); n != 0 {
		t.Errorf("after the replay %d rows still match", n)
	}
}

// planNode is the part of EXPLAIN (FORMAT JSON) the keyset test reads.
type planNode struct {
	Type       string     `json:"Node Type"`
	Relation   string     `json:"Relation Name"`
	Index      string     `json:"Index Name"`
	ActualRows int64      `json:"Actual Rows"`
	Hit        int64      `json:"Shared Hit Blocks"`
	Read       int64      `json:"Shared Read Blocks"`
	Plans      []planNode `json:"Plans"`
}

// scans returns the nodes of p that read the outbox table.
func (p planNode) scans() []planNode {
	var out []planNode
	if p.Relation == "outbox" {
		out = append(out, p)
	}
	for _, c := range p.Plans {
		out = append(out, c.scans()...)
	}
	return out
}

// 100k dead rows, half of them sharing one dead_at and the rest in groups
// of 500 (batches dead-lettered together): every page, first,
// inside the tie, or last, is read through outbox_dead_list_idx from its
// cursor, touching at most limit+1 rows and a bounded number of buffers,
// as the generic plan the store's sessions use (plan_cache_mode) has it.
func TestDeadListPagesByKeysetOver100kRows(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("inserts 100k rows")
	}
	st, _ := testenv.Store(t)
	ctx := context.Background()
	const n = 100_000
	_, err := st.Pool().Exec(ctx, `
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, attempts, last_error, dead_at)
SELECT 'deal', (g % 1000)::text, 'deal.funded', '{}', 25, 'receiver answered 500',
  CASE WHEN g % 2 = 0 THEN timestamptz '2026-11-20T12:00:00Z'
       ELSE timestamptz '2026-11-19T00:00:00Z' + (g / 1000) * interval '1 minute' END
FROM generate_series(1, $1::int) g`, n)
	if err != nil {
		t.Fatal(err)
	}
	// Delivered rows beside them, which no page may touch.
	if _, err := st.Pool().Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, dispatched_at)
		SELECT 'deal', g::text, 'deal.funded', '{}', now() FROM generate_series(1, 20000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Pool().Exec(ctx, `ANALYZE outbox`); err != nil {
		t.Fatal(err)
	}
	tie := pgtype.Timestamptz{Time: time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC), Valid: true}
	const limit = 50
	for _, tc := range []struct {
		name  string
		after *store.DeadCursor
	}{
		{"first page", nil},
		{"inside the tie", &store.DeadCursor{DeadAt: tie, ID: n / 2}},
		{"at the tie's end", &store.DeadCursor{DeadAt: tie, ID: 60}},
		{"inside a batch", &store.DeadCursor{DeadAt: pgtype.Timestamptz{Time: time.Date(2026, 11, 19, 0, 7, 0, 0, time.UTC), Valid: true}, ID: 7777}},
		{"last page", &store.DeadCursor{DeadAt: pgtype.Timestamptz{Time: time.Date(2026, 11, 19, 0, 0, 0, 0, time.UTC), Valid: true}, ID: 81}},
	} {
		sql, args := store.DeadListSQL(store.DeadFilter{}, tc.after, limit)
		var raw []byte
		if err := st.Pool().QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sql, args...).Scan(&raw); err != nil {
			t.Fatal(err)
		}
		var plan []struct{ Plan planNode }
		if err := json.Unmarshal(raw, &plan); err != nil || len(plan) != 1 {
			t.Fatalf("%s: explain: %v %s", tc.name, err, raw)
		}
		scans := plan[0].Plan.scans()
		if len(scans) != 1 {
			t.Fatalf("%s: %d scans of outbox, want 1: %s", tc.name, len(scans), raw)
		}
		s := scans[0]
		if s.Index != "outbox_dead_list_idx" || s.ActualRows > limit+1 || s.ActualRows == 0 {
			t.Errorf("%s: %s on %q read %d rows; want outbox_dead_list_idx and 1..%d rows\n%s",
				tc.name, s.Type, s.Index, s.ActualRows, limit+1, raw)
		}
		// 51 rows: a few index pages and at most one heap page per row.
		if b := plan[0].Plan.Hit + plan[0].Plan.Read; b > 2*(limit+1) {
			t.Errorf("%s: %d buffers touched, want at most %d", tc.name, b, 2*(limit+1))
		}
	}
	// The same pages through ListDead: a full walk sees every row once.
	got := listAll(t, st, store.DeadFilter{}, store.MaxDeadPage)
	slices.Sort(got)
	if distinct := len(slices.Compact(got)); len(got) != n || distinct != n {
		t.Errorf("walked %d rows, %d distinct; want %d", len(got), distinct, n)
	}
}

// A replay holding an older token than the lock's newest holder changes
// nothing: replays are fenced writes like every other. One
// whose token is current requeues, and its batches raise nothing.
func TestReplayWithAStaleFenceChangesNothing(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	ids := insertRows(t, st, deadRow{"deal", "1", "deal.funded", "boom", time.Now().Add(-time.Minute), false},
		deadRow{"deal", "2", "deal.funded", "boom", time.Now(), false})
	newer := store.Fence{Lock: "lock:reconciliation", Token: 7, Owner: "owner-7"}
	older := store.Fence{Lock: newer.Lock, Token: 6, Owner: "owner-6"}
	twin := store.Fence{Lock: newer.Lock, Token: 7, Owner: "other-owner"}
	if err := st.ClaimFence(ctx, newer); err != nil {
		t.Fatal(err)
	}
	for _, f := range []store.Fence{older, twin} {
		progressed := false
		n, err := st.Reconcile().ReplayDead(ctx, f, store.Replay{Filter: store.ReplayFilter{}, BatchSize: 1, Progress: func(int64) { progressed = true }})
		if !errors.Is(err, store.ErrStaleFence) || n != 0 || progressed {
			t.Fatalf("replay with %+v after token 7: %d, %v (progress %v); want 0, ErrStaleFence", f, n, err, progressed)
		}
		if got := listAll(t, st, store.DeadFilter{}, 10); len(got) != 2 {
			t.Fatalf("replay with %+v: dead rows %v, want both %v still dead", f, got, ids)
		}
	}
	if tok, _ := st.FenceToken(ctx, newer.Lock); tok != 7 {
		t.Fatalf("fence token %d after stale replays, want 7", tok)
	}
	if n, err := st.Reconcile().ReplayDead(ctx, newer, store.Replay{Filter: store.ReplayFilter{}, BatchSize: 1, Progress: nil}); err != nil || n != 2 {
		t.Fatalf("replay by the current holder: %d, %v; want 2", n, err)
	}
	if got := listAll(t, st, store.DeadFilter{}, 10); len(got) != 0 {
		t.Errorf("dead after the current holder's replay: %v", got)
	}
}

// A replay taken over between two batches stops at once: it reports the
// rows it requeued and ErrStaleFence, and the rest stay dead.
func TestReplayStopsWhenTakenOverMidway(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	t0 := time.Now().Add(-time.Hour)
	insertRows(t, st, deadRow{"a", "1", "e", "x", t0, false}, deadRow{"a", "2", "e", "x", t0.Add(time.Second), false},
		deadRow{"a", "3", "e", "x", t0.Add(2 * time.Second), false})
	mine := store.Fence{Lock: "lock:reconciliation", Token: 3, Owner: "replay"}
	next := store.Fence{Lock: mine.Lock, Token: 4, Owner: "reconcile"}
	n, err := st.Reconcile().ReplayDead(ctx, mine, store.Replay{Filter: store.ReplayFilter{}, BatchSize: 1, Progress: func(done int64) {
		if done == 1 {
			if err := st.ClaimFence(ctx, next); err != nil {
				t.Error(err)
			}
		}
	}})
	if !errors.Is(err, store.ErrStaleFence) || n != 1 {
		t.Fatalf("replay taken over after its first batch: %d, %v; want 1, ErrStaleFence", n, err)
	}
	if got := listAll(t, st, store.DeadFilter{}, 10); len(got) != 2 {
		t.Errorf("dead rows %v, want the two the replay did not reach", got)
	}
}
