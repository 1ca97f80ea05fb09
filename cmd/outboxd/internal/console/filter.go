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

// Op is a write the console confirms before doing it.
type Op string

// The console's confirmed writes: replay and discard of dead rows, resend
// of delivered ones.
const (
	OpReplay  Op = "replay"
	OpDiscard Op = "discard"
	OpResend  Op = "resend"
)

// opWords are the known Ops with the words their pages use and the form
// fields that select their rows.
var opWords = map[Op]struct {
	verb, past, rows string
	fields           []string
}{
	OpReplay:  {"Replay", "requeued", "dead-lettered", deadFields},
	OpDiscard: {"Discard", "discarded", "dead-lettered", deadFields},
	OpResend:  {"Resend", "resent", "delivered", resendFields},
}

// The form fields beyond those of `dead list`: the ids (repeatable, as
// --id), and resend's column for since and until, id range and bound.
const (
	idParam     = "id"
	onParam     = "on" // "dispatched": since and until bound dispatched_at; else created_at
	fromIDParam = "from-id"
	toIDParam   = "to-id"
	destParam   = "destination" // resend: only the rows routed to this destination
)

var (
	deadFields   = append([]string{idParam}, deadquery.Filters...)
	resendFields = append([]string{idParam, fromIDParam, toIDParam, onParam, destParam, deadquery.Limit}, deadquery.Filters...)
)

// selection is what a confirmed write changes.
type selection struct {
	dead   store.DeadFilter   // replay, discard
	resend store.ResendFilter // resend
	limit  int                // resend: at most this many rows; 0: no bound
	dest   string             // resend: only the rows routed to this destination; "": every one
}

// unknownField is a *deadquery.ParamError for the first field of v that
// is neither in known nor in extra: a typo must not widen a selection.
func unknownField(v url.Values, known []string, extra ...string) error {
	for name := range v {
		if !slices.Contains(known, name) && !slices.Contains(extra, name) {
			return &deadquery.ParamError{Name: name, Err: errors.New("unknown field")}
		}
	}
	return nil
}

// given reads a form: an empty field is a filter not given.
func given(v url.Values, only []string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		if !slices.Contains(only, name) {
			return "", false
		}
		return v.Get(name), v.Get(name) != ""
	}
}

// parseList reads the dead-letter list's filters and paging from v.
func parseList(v url.Values, now time.Time, extra ...string) (deadquery.Query, error) {
	if err := unknownField(v, append([]string{idParam}, deadquery.All...), extra...); err != nil {
		return deadquery.Query{}, err
	}
	q, err := deadquery.Parse(given(v, deadquery.All), now)
	if err != nil {
		return q, err
	}
	q.Filter.IDs, err = ids(v, idParam)
	return q, err
}

// parseSelection reads what op changes from the form v, which may also
// hold the fields extra. An invalid or unknown field is a
// *deadquery.ParamError naming it.
func parseSelection(op Op, v url.Values, now time.Time, extra ...string) (selection, error) {
	if err := unknownField(v, opWords[op].fields, extra...); err != nil {
		return selection{}, err
	}
	q, err := deadquery.Parse(given(v, deadquery.Filters), now)
	if err != nil {
		return selection{}, err
	}
	q.Filter.IDs, err = ids(v, idParam)
	if err != nil || op != OpResend {
		return selection{dead: q.Filter}, err
	}
	d := q.Filter
	sel := selection{resend: store.ResendFilter{IDs: d.IDs, AggregateType: d.AggregateType, AggregateID: d.AggregateID,
		EventType: d.EventType, Since: d.Since, Until: d.Until, SinceAgo: d.SinceAgo, UntilAgo: d.UntilAgo, Error: d.Error,
		Dispatched: v.Get(onParam) == "dispatched"}, dest: v.Get(destParam)}
	for name, dst := range map[string]*int64{fromIDParam: &sel.resend.FromID, toIDParam: &sel.resend.ToID} {
		if *dst, err = positive(v, name); err != nil {
			return selection{}, err
		}
	}
	limit, err := positive(v, deadquery.Limit)
	sel.limit = int(limit)
	return sel, err
}

// ids are the positive whole numbers of field name.
func ids(v url.Values, name string) ([]int64, error) {
	var out []int64
	for _, s := range v[name] {
		if s == "" {
			continue
		}
		id, err := strconv.ParseInt(s, 10, 64)
		if err != nil || id <= 0 {
			return nil, &deadquery.ParamError{Name: name, Err: errors.New("want an outbox id (a positive whole number)")}
		}
		out = append(out, id)
	}
	return out, nil
}

// positive is field name's positive whole number; 0 when not given.
func positive(v url.Values, name string) (int64, error) {
	s := v.Get(name)
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n > 1<<31-1 {
		return 0, &deadquery.ParamError{Name: name, Err: errors.New("want a positive whole number")}
	}
	return n, nil
}

// field is one hidden form field carrying a selection to the write.
type field struct{ Name, Value string }

// formFields are v's given fields among names, for the confirmation's
// form and links.
func formFields(v url.Values, names []string) []field {
	var out []field
	for _, n := range names {
		for _, s := range v[n] {
			if s != "" {
				out = append(out, field{n, s})
			}
		}
	}
	return out
}

// encode is fs as a query string.
func encode(fs []field) string {
	v := url.Values{}
	for _, f := range fs {
		v.Add(f.Name, f.Value)
	}
	return v.Encode()
}
