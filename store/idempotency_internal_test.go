package store

import (
	"slices"
	"strings"
	"testing"
)

// complete with the settle fragment uses every parameter of both, and
// sends no name: what TestQueries checks of the statements in the files.
func TestIdempotencyStatements(t *testing.T) {
	q := completeSettledQ
	want := append(slices.Clone(completeQ.params), settleParams...)
	if !slices.Equal(q.params, want) {
		t.Errorf("%s uses %v, want %v", q.name, q.params, want)
	}
	if strings.Contains(q.sql, "{{") || strings.Contains(q.sql, "@claim") {
		t.Errorf("%s: a fragment or a name is left in the text sent", q.name)
	}
}
