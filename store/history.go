package store

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// MaxHistory is how many of a row's last failed attempts outbox_attempts
// keeps (historyCTE's 10), each with the first 300 characters of the
// failure's text.
const MaxHistory = 10

// historyCTE records each failure completeSQL wrote (its CTE failed: id,
// attempts after it, created_at) in outbox_attempts, in the same fenced
// statement: the failure's kind ($11) and send duration in ms ($12, -1:
// unknown), the start of its text ($6), Postgres' now() and the writer's
// token; and drops the row's entries older than its last MaxHistory, or
// numbered above its attempts (from before a replay reset them). Both are
// driven by the failures' ids (the primary key), so a batch without
// failures touches nothing here.
const historyCTE = `
history AS (
  INSERT INTO outbox_attempts (outbox_id, attempt, created_at, kind, excerpt, duration_ms, fencing_token)
  SELECT f.id, f.attempts, f.created_at, h.kind, left(h.err, 300), NULLIF(h.ms, -1), $2::bigint
  FROM failed f JOIN unnest($5::bigint[], $6::text[], $11::text[], $12::bigint[]) AS h(id, err, kind, ms) ON h.id = f.id
  ON CONFLICT (outbox_id, attempt) DO UPDATE SET created_at = EXCLUDED.created_at, at = now(), kind = EXCLUDED.kind,
    excerpt = EXCLUDED.excerpt, duration_ms = EXCLUDED.duration_ms, fencing_token = EXCLUDED.fencing_token
  RETURNING 1),
trimmed AS (
  DELETE FROM outbox_attempts a WHERE a.outbox_id = ANY ($5::bigint[])
    AND EXISTS (SELECT 1 FROM failed f WHERE f.id = a.outbox_id
      AND (a.attempt <= f.attempts - 10 OR a.attempt > f.attempts))
  RETURNING 1)`

// attemptsOf are the kinds and durations (ms, -1: unknown) of failures,
// completeSQL's $11 and $12.
func attemptsOf(failures []Failure) ([]string, []int64) {
	kinds, ms := make([]string, len(failures)), make([]int64, len(failures))
	for i, x := range failures {
		kinds[i], ms[i] = x.Kind, -1
		if kinds[i] == "" {
			kinds[i] = "error"
		}
		if x.Duration > 0 {
			ms[i] = x.Duration.Milliseconds()
		}
	}
	return kinds, ms
}

// Attempt is one failed attempt of a row, as its history shows it.
type Attempt struct {
	Attempt      int                `json:"attempt"`
	At           pgtype.Timestamptz `json:"at"`
	Kind         string             `json:"kind"`
	Excerpt      string             `json:"excerpt"`
	DurationMS   *int64             `json:"duration_ms"`
	FencingToken int64              `json:"fencing_token"`
}

// History returns the recorded failed attempts of row id created at
// createdAt, oldest first (never nil).
func (s *Store) History(ctx context.Context, id int64, createdAt pgtype.Timestamptz) ([]Attempt, error) {
	rows, err := s.db.Query(ctx, `SELECT attempt, at, kind, excerpt, duration_ms, fencing_token
FROM outbox_attempts WHERE outbox_id = $1 AND created_at = $2 ORDER BY attempt`, id, createdAt)
	if err != nil {
		return nil, wrap("history", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Attempt])
	if err != nil {
		return nil, wrap("history", err)
	}
	for i := range out {
		out[i].At.Time = out[i].At.Time.UTC()
	}
	if out == nil {
		out = []Attempt{}
	}
	return out, nil
}
