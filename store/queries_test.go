package store

import (
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Every statement's header lists exactly the parameters its text uses
// (dead.sql's filter conditions, written in only when set, are checked
// through the statements they go into), and what is sent is positional.
func TestQueries(t *testing.T) {
	filters := []string{"dead_list", "dead_list_after", "dead_count", "dead_replay", "dead_discard"}
	all := pgx.NamedArgs{}
	cond := DeadFilter{IDs: []int64{1}, AggregateType: "a", AggregateID: "b", EventType: "c*", Since: time.Unix(1, 0), Until: time.Unix(2, 0),
		SinceAgo: 1, UntilAgo: 1, Error: "e"}.filter(all)
	resendCond := ResendFilter{IDs: []int64{1}, FromID: 1, ToID: 2, AggregateType: "a", AggregateID: "b", EventType: "c*",
		Since: time.Unix(1, 0), Until: time.Unix(2, 0), SinceAgo: 1, UntilAgo: 1, Error: "e", Kinds: []EventKind{{"a", "c"}}}.filter(pgx.NamedArgs{})
	for name, q := range queries {
		switch {
		case slices.Contains(filters, name):
			q = q.with(cond)
		case name == "resend" || name == "resend_count" || name == "resend_kinds":
			q = q.with(resendCond)
		}
		if !slices.Equal(q.params, q.header) {
			t.Errorf("%s: the header lists %v, the text uses %v", name, q.header, q.params)
		}
		if strings.Contains(q.sql, "@") && regexp.MustCompile(`@[a-z_]`).MatchString(q.sql) {
			t.Errorf("%s: a named parameter is left in the text sent", name)
		}
		if strings.Contains(q.sql, "{{") {
			t.Errorf("%s: a fragment is left unnamed", name)
		}
	}
}

// A call that leaves a parameter out, or names one the statement does not
// have, is refused: it would otherwise run as NULL.
func TestQueryArgsAreStrict(t *testing.T) {
	q := stmt("history")
	if _, err := q.args(pgx.NamedArgs{"id": 1}); err == nil {
		t.Error("a missing parameter was accepted")
	}
	if _, err := q.args(pgx.NamedArgs{"id": 1, "created_at": nil, "extra": 2}); err == nil {
		t.Error("an unknown parameter was accepted")
	}
	args, err := q.args(pgx.NamedArgs{"created_at": "c", "id": "i"})
	if err != nil || !slices.Equal(args, []any{"i", "c"}) {
		t.Errorf("args %v, %v; want the header's order", args, err)
	}
}

// compile numbers the names in the header's order, and leaves an @ in a
// string or a comment alone.
func TestCompile(t *testing.T) {
	q, err := compile("t", "SELECT @b, '@a', @a -- @c\n, @b::int", []string{"a", "b", "c"})
	if err != nil {
		t.Fatal(err)
	}
	if want := "SELECT $2, '@a', $1 -- @c\n, $2::int"; q.sql != want || !slices.Equal(q.params, []string{"a", "b"}) {
		t.Errorf("compiled %q %v, want %q [a b]", q.sql, q.params, want)
	}
	if _, err := compile("t", "SELECT @x", []string{"a"}); err == nil {
		t.Error("a name the header does not list was accepted")
	}
}
