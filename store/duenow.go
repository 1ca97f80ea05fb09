package store

import "context"

// dueNowSQL makes the rows $4 that are backing off due now, as one fenced
// statement (fenceCTE: $1..$3): rows still pending, not dead, tried before
// and not yet due. Their attempts and last_error stay. available_at stays
// above created_at, so the read path finds them through
// outbox_backoff_idx, as it finds every row backing off.
const dueNowSQL = fenceCTE + `,
resumed AS (
  UPDATE outbox SET available_at = now()
  WHERE id = ANY($4::bigint[]) AND dispatched_at IS NULL AND dead_at IS NULL
    AND attempts > 0 AND available_at > now() AND EXISTS (SELECT 1 FROM fence)
  RETURNING 1)
SELECT EXISTS (SELECT 1 FROM fence), (SELECT count(*) FROM resumed)`

// DueNow makes the rows ids due now if they are backing off (a destination
// that failed them has recovered), fenced; it returns how many it changed.
func (s *Store) DueNow(ctx context.Context, f Fence, ids []int64) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	var n int64
	if err := s.fenced(ctx, f, dueNowSQL, []*int64{&n}, ids); err != nil {
		return 0, wrap("due now", err)
	}
	return n, nil
}
