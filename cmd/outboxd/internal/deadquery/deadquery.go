// Package deadquery reads the dead-letter filters and paging shared by
// `outboxd dead list`, `outboxd replay` and /dead: command-line flags and
// query parameters of the same names, checked alike, an invalid one named.
package deadquery

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/pflag"

	"github.com/outboxd/outboxd/store"
)

// The parameters, as flags (--name) and as query parameters (name=).
const (
	Aggregate = "aggregate"
	EventType = "event-type"
	Since     = "since"
	Until     = "until"
	Error     = "error"
	Limit     = "limit"
	After     = "after"
)

// DefaultLimit is a page's size when --limit is not given.
const DefaultLimit = 50

// Filters are the parameters that select rows; All adds those that page the list.
var (
	Filters = []string{Aggregate, EventType, Since, Until, Error}
	All     = []string{Aggregate, EventType, Since, Until, Error, Limit, After}
)

var help = map[string]string{
	Aggregate: "only this aggregate: TYPE/ID, or TYPE for every aggregate of that type",
	EventType: "only this event type; a glob: * any run of characters, ? one, \\ makes the next literal",
	Since:     "dead-lettered at or after this: RFC 3339 (2026-11-24T03:00:00Z) or a duration ago (90m, 24h, 7d)",
	Until:     "dead-lettered before this: RFC 3339 or a duration ago, as --since",
	Error:     "last_error contains this text (case-insensitive)",
	Limit:     fmt.Sprintf("rows per page, 1..%d", store.MaxDeadPage),
	After:     "continue after this cursor (printed with the previous page)",
}

// AddFlags defines the named parameters as string flags on fs.
func AddFlags(fs *pflag.FlagSet, names ...string) {
	for _, n := range names {
		def := ""
		if n == Limit {
			def = strconv.Itoa(DefaultLimit)
		}
		fs.String(n, def, help[n])
	}
}

// FromFlags reads the parameters set on fs (defaults are not "given").
func FromFlags(fs *pflag.FlagSet) func(string) (string, bool) {
	return func(name string) (string, bool) {
		f := fs.Lookup(name)
		if f == nil || !f.Changed {
			return "", false
		}
		return f.Value.String(), true
	}
}

// Known reports whether name is one of the parameters.
func Known(name string) bool { _, ok := help[name]; return ok }

// Query is what the parameters ask for.
type Query struct {
	Filter store.DeadFilter
	After  *store.DeadCursor // nil: the first page
	Limit  int
}

// ParamError names the parameter whose value is invalid.
type ParamError struct {
	Name string
	Err  error
}

func (e *ParamError) Error() string { return e.Name + ": " + e.Err.Error() }
func (e *ParamError) Unwrap() error { return e.Err }

// Parse reads the parameters get says were given; now orders since and
// until when one of them is a duration ago.
func Parse(get func(name string) (string, bool), now time.Time) (Query, error) {
	q := Query{Limit: DefaultLimit}
	for _, step := range parseSteps {
		if err := step(get, now, &q); err != nil {
			return Query{}, err
		}
	}
	return q, nil
}

// parseSteps read the parameters in order; the first invalid one ends Parse.
var parseSteps = []func(get getter, now time.Time, q *Query) error{
	checkValues,
	parseAggregate,
	parseTextFilters,
	parseTimeRange,
	parseLimit,
	parseAfter,
}

// getter returns a parameter's value and whether it was given.
type getter = func(name string) (string, bool)

// paramErr is the *ParamError for name, its cause formatted as fmt.Errorf.
func paramErr(name string, format string, a ...any) error {
	return &ParamError{Name: name, Err: fmt.Errorf(format, a...)}
}

// checkValues rejects, for every parameter, a given value that is empty,
// not UTF-8 or holds a NUL, which Postgres text cannot store.
func checkValues(get getter, _ time.Time, _ *Query) error {
	for _, name := range All {
		v, ok := get(name)
		if !ok {
			continue
		}
		switch {
		case v == "":
			return paramErr(name, "empty value")
		case !utf8.ValidString(v):
			return paramErr(name, "not valid UTF-8")
		case strings.ContainsRune(v, 0):
			return paramErr(name, "contains NUL")
		}
	}
	return nil
}

// parseAggregate reads TYPE or TYPE/ID.
func parseAggregate(get getter, _ time.Time, q *Query) error {
	v, ok := get(Aggregate)
	if !ok {
		return nil
	}
	t, id, hasID := strings.Cut(v, "/")
	if t == "" || (hasID && id == "") {
		return paramErr(Aggregate, "wants TYPE or TYPE/ID, got %q", v)
	}
	q.Filter.AggregateType, q.Filter.AggregateID = t, id
	return nil
}

// parseTextFilters copies the event-type glob and the error text as given.
func parseTextFilters(get getter, _ time.Time, q *Query) error {
	if v, ok := get(EventType); ok {
		q.Filter.EventType = v
	}
	if v, ok := get(Error); ok {
		q.Filter.Error = v
	}
	return nil
}

// parseTimeRange reads since and until and rejects a since that is not
// before until. A duration ago is passed as one (SinceAgo, UntilAgo), for
// Postgres to count back from its own now(); now only orders the two bounds.
func parseTimeRange(get getter, now time.Time, q *Query) error {
	since, err := parseBound(get, now, Since, &q.Filter.Since, &q.Filter.SinceAgo)
	if err != nil {
		return err
	}
	until, err := parseBound(get, now, Until, &q.Filter.Until, &q.Filter.UntilAgo)
	if err != nil {
		return err
	}
	if !since.IsZero() && !until.IsZero() && !since.Before(until) {
		return paramErr(Since, "%s is not before until (%s)", since.Format(time.RFC3339), until.Format(time.RFC3339))
	}
	return nil
}

// parseBound reads the time parameter name into *at or *ago and returns
// the instant it stands for at now (zero when not given).
func parseBound(get getter, now time.Time, name string, at *time.Time, ago *time.Duration) (time.Time, error) {
	v, ok := get(name)
	if !ok {
		return time.Time{}, nil
	}
	t, d, err := parseTime(v)
	if err != nil {
		return time.Time{}, paramErr(name, "%w", err)
	}
	*at, *ago = t, d
	if d > 0 {
		return now.Add(-d), nil
	}
	return t, nil
}

// parseLimit reads the page size, 1..store.MaxDeadPage.
func parseLimit(get getter, _ time.Time, q *Query) error {
	v, ok := get(Limit)
	if !ok {
		return nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > store.MaxDeadPage {
		return paramErr(Limit, "wants a whole number from 1 to %d, got %q", store.MaxDeadPage, v)
	}
	q.Limit = n
	return nil
}

// parseAfter reads the cursor of the previous page.
func parseAfter(get getter, _ time.Time, q *Query) error {
	v, ok := get(After)
	if !ok {
		return nil
	}
	c, err := store.ParseDeadCursor(v)
	if err != nil {
		return paramErr(After, "%w", err)
	}
	q.After = &c
	return nil
}

// parseTime reads RFC 3339 (t) or a positive duration ago (Go's units
// plus d for 24 h).
func parseTime(v string) (t time.Time, ago time.Duration, err error) {
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, 0, nil
	}
	d, err := time.ParseDuration(v)
	if days, ok := strings.CutSuffix(v, "d"); ok && err != nil {
		// Bounded so that it cannot overflow (Go's own units stop at ~292 years).
		if n, aerr := strconv.Atoi(days); aerr == nil && n > 0 && n <= 100000 {
			d, err = time.Duration(n)*24*time.Hour, nil
		}
	}
	if err != nil || d <= 0 {
		return time.Time{}, 0, errors.New("wants an RFC 3339 time (2026-11-24T03:00:00Z) or a positive duration ago (90m, 24h, 7d), got " + strconv.Quote(v))
	}
	return time.Time{}, d, nil
}
