package deadquery_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/deadquery"
	"github.com/outboxd/outboxd/store"
)

var now = time.Date(2026, 11, 24, 3, 0, 0, 0, time.UTC)

func parse(params map[string]string) (deadquery.Query, error) {
	return deadquery.Parse(func(name string) (string, bool) {
		v, ok := params[name]
		return v, ok
	}, now)
}

func TestParseReadsEachParameter(t *testing.T) {
	t.Parallel()
	cursor := store.DeadCursor{ID: 17}
	cursor.DeadAt.Time, cursor.DeadAt.Valid = now.Add(-time.Hour), true
	q, err := parse(map[string]string{
		"aggregate": "deal/42/a", "event-type": "deal.*", "since": "7d", "until": "2026-11-24T02:30:00.5+01:00",
		"error": "HTTP 5", "limit": "1000", "after": cursor.String(),
	})
	if err != nil {
		t.Fatal(err)
	}
	f := q.Filter
	until := time.Date(2026, 11, 24, 1, 30, 0, 5e8, time.UTC)
	if f.AggregateType != "deal" || f.AggregateID != "42/a" || f.EventType != "deal.*" || f.Error != "HTTP 5" ||
		!f.Since.IsZero() || f.SinceAgo != 7*24*time.Hour || !f.Until.Equal(until) || f.UntilAgo != 0 || q.Limit != 1000 ||
		q.After == nil || q.After.ID != 17 || !q.After.DeadAt.Time.Equal(cursor.DeadAt.Time) {
		t.Errorf("parsed %+v after %+v", q, q.After)
	}

	q, err = parse(map[string]string{"aggregate": "deal", "since": "90m"})
	if err != nil || q.Filter.AggregateType != "deal" || q.Filter.AggregateID != "" ||
		q.Filter.SinceAgo != 90*time.Minute || !q.Filter.Since.IsZero() || q.Limit != deadquery.DefaultLimit || q.After != nil {
		t.Errorf("type alone, a duration: %+v, %v", q, err)
	}
	if q, err := parse(nil); err != nil || q.Limit != deadquery.DefaultLimit || q.After != nil || q.Filter.AggregateType != "" {
		t.Errorf("nothing given: %+v, %v", q, err)
	}
}

func TestParseNamesTheBadParameter(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		params map[string]string
		name   string
		says   string
	}{
		{map[string]string{"aggregate": "/42"}, "aggregate", "TYPE/ID"},
		{map[string]string{"aggregate": "deal/"}, "aggregate", "TYPE/ID"},
		{map[string]string{"aggregate": ""}, "aggregate", "empty"},
		{map[string]string{"event-type": "\xff"}, "event-type", "UTF-8"},
		{map[string]string{"error": "a\x00b"}, "error", "NUL"},
		{map[string]string{"since": "yesterday"}, "since", "RFC 3339"},
		{map[string]string{"since": "-5m"}, "since", "positive"},
		{map[string]string{"until": "0s"}, "until", "positive"},
		{map[string]string{"until": "2026-11-24"}, "until", "RFC 3339"},
		{map[string]string{"since": "999999999d"}, "since", "duration"},
		{map[string]string{"since": "1h", "until": "2h"}, "since", "not before"},
		{map[string]string{"limit": "0"}, "limit", "1 to 1000"},
		{map[string]string{"limit": "1001"}, "limit", "1 to 1000"},
		{map[string]string{"limit": "ten"}, "limit", "1 to 1000"},
		{map[string]string{"after": "page2"}, "after", "cursor"},
	} {
		_, err := parse(tc.params)
		var pe *deadquery.ParamError
		if !errors.As(err, &pe) || pe.Name != tc.name || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%v: %v, want an error naming %s saying %q", tc.params, err, tc.name, tc.says)
		}
	}
}

func TestKnownIsEveryParameter(t *testing.T) {
	t.Parallel()
	for _, n := range deadquery.All {
		if !deadquery.Known(n) {
			t.Errorf("%s not known", n)
		}
	}
	for _, n := range []string{"event_type", "offset", "id", ""} {
		if deadquery.Known(n) {
			t.Errorf("%q known", n)
		}
	}
}
