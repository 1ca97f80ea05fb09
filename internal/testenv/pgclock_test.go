package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// A server started with a clock offset answers now() that far from the
// machine's clock, ahead or behind, and still does after a crash restart.
func TestPostgresServerClockIsOffset(t *testing.T) {
	t.Parallel()
	for _, offset := range []time.Duration{time.Hour, -time.Hour} {
		t.Run(offset.String(), func(t *testing.T) {
			t.Parallel()
			s := StartPostgresServerClock(t, offset)
			for _, when := range []string{"started", "after a crash restart"} {
				if when != "started" {
					s.CrashRestart()
				}
				if got := serverOffset(t, s.DSN); got < offset-time.Minute || got > offset+time.Minute {
					t.Fatalf("%s: the server's clock is %s off the machine's, want %s", when, got, offset)
				}
			}
		})
	}
}

// serverOffset is how far the server's clock_timestamp() is from the
// machine's clock, read between two readings of the machine's.
func serverOffset(t *testing.T, dsn string) time.Duration {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	before := time.Now()
	var at time.Time
	if err := conn.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&at); err != nil {
		t.Fatal(err)
	}
	return at.Sub(before.Add(time.Since(before) / 2))
}
