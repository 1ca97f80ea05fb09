package store

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// dueNowQ is due_now.sql.
var dueNowQ = stmt("due_now")

// DueNow makes the rows ids due now if they are backing off (a destination
// that failed them has recovered), fenced; it returns how many it changed.
func (s ReadPath) DueNow(ctx context.Context, f Fence, ids []int64) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	var n int64
	if err := s.fenced(ctx, f, dueNowQ, []*int64{&n}, pgx.NamedArgs{"ids": ids}); err != nil {
		return 0, wrap("due now", err)
	}
	return n, nil
}
