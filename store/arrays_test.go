package store

import (
	"testing"

	"github.com/jackc/pgx/v5/pgtype"
)

// int8Array is the text form of the array the slice it replaces sent, made
// in one allocation where the slice took one per id (see int8Array).
func TestInt8ArrayIsTheSlicesText(t *testing.T) {
	m := pgtype.NewMap()
	ids := make([]int64, 1000)
	for i := range ids {
		ids[i] = int64(1_000_000+i) * int64(1-2*(i%2)) // signs too
	}
	for _, c := range [][]int64{ids, {}, nil, {0}, {-9223372036854775808, 9223372036854775807}} {
		want, err := m.Encode(pgtype.Int8ArrayOID, pgtype.TextFormatCode, c, nil)
		if err != nil {
			t.Fatal(err)
		}
		if c == nil {
			want = []byte("{}") // nil, like an empty list, is no ids: never NULL
		}
		if got := int8Array(c); got != string(want) {
			t.Errorf("int8Array(%d ids) = %.40q, the slice's text %.40q", len(c), got, want)
		}
	}
	if n := testing.AllocsPerRun(5, func() { _ = int8Array(ids) }); n > 1 {
		t.Errorf("int8Array: %.0f allocations for 1,000 ids, want 1", n)
	}
}
