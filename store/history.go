package store

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// MaxHistory is how many of a row's last failed attempts outbox_attempts
// keeps (complete.sql's 10), each with the first 300 characters of the
// failure's text.
const MaxHistory = 10

// attemptsOf are the kinds and durations (ms, -1: unknown) of failures,
// complete.sql's @failed_kinds and @failed_ms.
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

// historyQ is history.sql.
var historyQ = stmt("history")

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
func (s Ops) History(ctx context.Context, id int64, createdAt pgtype.Timestamptz) ([]Attempt, error) {
	rows, err := historyQ.query(ctx, s.db, pgx.NamedArgs{"id": id, "created_at": createdAt})
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
