package console

import (
	"errors"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/deadquery"
	"github.com/outboxd/outboxd/store"
)

// Op is a write the console confirms before doing: replay or discard of
// dead rows.
type Op string

// The console's confirmed writes.
const (
	OpReplay  Op = "replay"
	OpDiscard Op = "discard"
)

// ops are the known Ops, with the words their pages use.
var ops = map[Op]struct{ verb, past string }{
	OpReplay:  {"Replay", "requeued"},
	OpDiscard: {"Discard", "discarded"},
}

// Filter selects the rows an Op changes: the filters of `dead list` and
// the ids of the id parameter.
type Filter = store.DeadFilter

// idParam names the rows by outbox id (repeatable), as --id does.
const idParam = "id"

// fieldNames are the form fields a Filter is written to and read from.
var fieldNames = append([]string{idParam}, deadquery.Filters...)

// parseFilter reads the filters and paging of `dead list` (and id) from
// v, which may also hold the fields extra. An invalid or unknown field is
// a *deadquery.ParamError naming it: a typo must not widen a selection.
func parseFilter(v url.Values, now time.Time, extra ...string) (deadquery.Query, error) {
	for name := range v {
		if !deadquery.Known(name) && name != idParam && !slices.Contains(extra, name) {
			return deadquery.Query{}, &deadquery.ParamError{Name: name, Err: errors.New("unknown field")}
		}
	}
	// An empty field of the form is a filter not given.
	q, err := deadquery.Parse(func(name string) (string, bool) { return v.Get(name), v.Get(name) != "" }, now)
	if err != nil {
		return q, err
	}
	for _, s := range v[idParam] {
		id, err := strconv.ParseInt(s, 10, 64)
		if err != nil || id <= 0 {
			return q, &deadquery.ParamError{Name: idParam, Err: errors.New("want an outbox id (a positive whole number)")}
		}
		q.Filter.IDs = append(q.Filter.IDs, id)
	}
	return q, nil
}

// everyRow: f selects every dead row.
func everyRow(f Filter) bool {
	return len(f.IDs) == 0 && f.AggregateType == "" && f.AggregateID == "" && f.EventType == "" &&
		f.Since.IsZero() && f.Until.IsZero() && f.Error == ""
}

// field is one hidden form field carrying a filter to the write.
type field struct{ Name, Value string }

// filterFields are v's given filter fields, for the confirmation's form
// and links.
func filterFields(v url.Values) []field {
	var out []field
	for _, n := range fieldNames {
		for _, s := range v[n] {
			if s != "" {
				out = append(out, field{n, s})
			}
		}
	}
	return out
}

// filterQuery is the filter fields as a query string.
func filterQuery(fs []field) string {
	v := url.Values{}
	for _, f := range fs {
		v.Add(f.Name, f.Value)
	}
	return v.Encode()
}
