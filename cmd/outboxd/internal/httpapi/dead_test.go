package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/httpapi"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/store"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// get asks h for path and decodes the JSON answer into v.
func get(t *testing.T, h http.Handler, path string, v any) int {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("GET %s: Content-Type %q", path, ct)
	}
	if err := json.Unmarshal(rec.Body.Bytes(), v); err != nil {
		t.Fatalf("GET %s: %d %q: %v", path, rec.Code, rec.Body, err)
	}
	return rec.Code
}

// /dead serves the store's list with the CLI's filters and paging as query
// parameters; a bad parameter is a 400 naming it, and nothing is written.
func TestDeadServesTheListReadOnly(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	_, err := st.Pool().Exec(ctx, `
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, attempts, last_error, dead_at)
SELECT 'deal', (g % 3)::text, CASE WHEN g % 2 = 0 THEN 'deal.funded' ELSE 'deal.closed' END, '{}', 25,
  CASE WHEN g % 4 = 0 THEN 'Zeitüberschreitung: Empfänger antwortete nicht' ELSE 'HTTP 500' END,
  timestamptz '2026-11-20T12:00:00Z' + (g / 3) * interval '1 minute'
FROM generate_series(1, 20) g;
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('deal', '1', 'deal.funded', '{}')`)
	if err != nil {
		t.Fatal(err)
	}
	h := httpapi.Handler(httpapi.Deps{Dead: st.Ops(), Status: func(context.Context) (any, error) { return nil, nil }})

	// Page through a filtered list, 3 at a time, and compare with the store's.
	q := url.Values{"event-type": {"*.funded"}, "error": {"ZEITüber"}, "aggregate": {"deal"}, "limit": {"3"},
		"since": {"2026-11-20T12:01:00Z"}, "until": {"2026-11-20T12:07:00Z"}}
	var served []int64
	for pages := 0; ; pages++ {
		var page store.DeadPage
		if code := get(t, h, "/dead?"+q.Encode(), &page); code != http.StatusOK || pages > 10 {
			t.Fatalf("GET /dead?%s: %d %+v", q.Encode(), code, page)
		}
		if len(page.Events) > 3 {
			t.Fatalf("page of %d, limit 3", len(page.Events))
		}
		for _, e := range page.Events {
			served = append(served, e.ID)
		}
		if page.Next == "" {
			break
		}
		q.Set("after", page.Next)
	}
	var want []int64
	if err := st.Pool().QueryRow(ctx, `SELECT array_agg(id ORDER BY dead_at DESC, id DESC) FROM outbox
		WHERE dead_at >= '2026-11-20T12:01:00Z' AND dead_at < '2026-11-20T12:07:00Z'
		  AND event_type LIKE '%.funded' AND last_error LIKE 'Zeit%'`).Scan(&want); err != nil {
		t.Fatal(err)
	}
	if len(want) < 2 || !slices.Equal(served, want) {
		t.Errorf("served %v, want %v (at least 2)", served, want)
	}
	// No parameters: the first page of everything dead.
	var all store.DeadPage
	if code := get(t, h, "/dead", &all); code != http.StatusOK || len(all.Events) != 20 || all.Next != "" {
		t.Errorf("GET /dead: %d, %d events, next %q; want 20 and no next", code, len(all.Events), all.Next)
	}

	for _, tc := range []struct{ query, param string }{
		{"limit=0", "limit"},
		{"since=last+week", "since"},
		{"aggregate=%2F1", "aggregate"},
		{"after=2", "after"},
		{"error=%FF", "error"},
		{"event_type=deal.funded", "event_type"}, // a typo must not widen the list
		{"limit=1&limit=2", "limit"},
	} {
		var body map[string]string
		code := get(t, h, "/dead?"+tc.query, &body)
		if code != http.StatusBadRequest || body["parameter"] != tc.param || !strings.Contains(body["error"], tc.param) {
			t.Errorf("GET /dead?%s: %d %v, want 400 naming %s", tc.query, code, body, tc.param)
		}
	}

	// Read-only: only GET.
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/dead", nil))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST /dead: %d, want 405", rec.Code)
	}
	var dead int64
	if err := st.Pool().QueryRow(ctx, `SELECT count(*) FROM outbox WHERE dead_at IS NOT NULL`).Scan(&dead); err != nil || dead != 20 {
		t.Errorf("dead rows after the requests: %d, %v; want 20", dead, err)
	}
}

// /dead/{id} serves one dead row with its attempt history, as `outboxd
// dead show --json` prints it; a row that is not dead, or none, is a 404,
// and an id that is no number a 400.
func TestDeadServesOneRowWithItsHistory(t *testing.T) {
	t.Parallel()
	st, _ := testenv.Store(t)
	ctx := context.Background()
	var dead, pending int64
	if err := st.Pool().QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, attempts, last_error, dead_at)
		VALUES ('deal', '1', 'deal.funded', '{"n": 1}', 2, 'HTTP 503', now()) RETURNING id`).Scan(&dead); err != nil {
		t.Fatal(err)
	}
	if err := st.Pool().QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		VALUES ('deal', '2', 'deal.funded', '{}') RETURNING id`).Scan(&pending); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Pool().Exec(ctx, `INSERT INTO outbox_attempts (outbox_id, attempt, created_at, kind, excerpt, duration_ms, fencing_token)
		SELECT id, a, created_at, 'http_503', 'down', 20, 7 FROM outbox, generate_series(1, 2) a WHERE id = $1`, dead); err != nil {
		t.Fatal(err)
	}
	h := httpapi.Handler(httpapi.Deps{Dead: st.Ops(), Status: func(context.Context) (any, error) { return nil, nil }})

	var row struct {
		ID      int64 `json:"id"`
		History []struct {
			Attempt int    `json:"attempt"`
			Kind    string `json:"kind"`
		} `json:"history"`
	}
	if code := get(t, h, "/dead/"+strconv.FormatInt(dead, 10), &row); code != http.StatusOK || row.ID != dead ||
		len(row.History) != 2 || row.History[1].Attempt != 2 || row.History[1].Kind != "http_503" {
		t.Errorf("GET /dead/%d: %d %+v; want the row with its 2 attempts", dead, code, row)
	}
	var body map[string]string
	for path, want := range map[string]int{
		"/dead/" + strconv.FormatInt(pending, 10): http.StatusNotFound,
		"/dead/999999":  http.StatusNotFound,
		"/dead/seventy": http.StatusBadRequest,
	} {
		if code := get(t, h, path, &body); code != want || body["error"] == "" {
			t.Errorf("GET %s: %d %v, want %d with an error", path, code, body, want)
		}
	}
}
