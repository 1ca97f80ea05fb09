package store

import (
	"slices"
	"strconv"
	"strings"
)

// int8Array is ids as a Postgres array literal ("{1,2,3}"), for a
// parameter written $n::bigint[]: pgx sends a string as text, in every
// query mode, built here in one allocation. Passed as []int64, pgx encoded
// the array through pgtype.FlatArray, whose Index boxes each element: an
// allocation per id above 255, for every id the read's Skip (up to 4
// batches of ids) and Complete's delivered ids pass.
func int8Array(ids []int64) string {
	var b strings.Builder
	if len(ids) > 0 {
		// Room for every id as wide as the widest end of the range, and a comma.
		var buf [20]byte
		w := max(len(strconv.AppendInt(buf[:0], slices.Min(ids), 10)), len(strconv.AppendInt(buf[:0], slices.Max(ids), 10)))
		b.Grow(2 + len(ids)*(w+1))
	}
	b.WriteByte('{')
	var buf [20]byte
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(strconv.AppendInt(buf[:0], id, 10))
	}
	b.WriteByte('}')
	return b.String()
}
