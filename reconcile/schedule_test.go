package reconcile

import (
	"strings"
	"testing"
	"time"
)

// robfig/cron v3.0.1 panics on a time zone with no space after it.
// ParseSchedule returns an error for every such spec, and never panics.
func TestScheduleWithOnlyAZoneIsAnError(t *testing.T) {
	t.Parallel()
	for _, spec := range []string{"CRON_TZ=UTC", "TZ=0", "TZ=", "CRON_TZ=", "CRON_TZ=UTC ", "CRON_TZ=UTC\t", "0 0 30 2 *"} {
		if _, err := ParseSchedule(spec); err == nil {
			t.Errorf("schedule %q accepted", spec)
		}
	}
	for _, spec := range []string{"CRON_TZ=UTC */5 * * * *", "CRON_TZ=Europe/Berlin\t0 3 * * *", "TZ=UTC @every 10s", "@hourly"} {
		if _, err := ParseSchedule(spec); err != nil {
			t.Errorf("schedule %q refused: %v", spec, err)
		}
	}
}

// "@every" below MinEvery is refused as written, with or without a zone:
// cron itself rounds such a delay (0s included) up to 1s.
func TestEveryBelowOneSecondIsRefused(t *testing.T) {
	t.Parallel()
	for _, spec := range []string{"@every 0s", "@every 500ms", "@every 999ms", "TZ=UTC @every 0s", "CRON_TZ=Europe/Berlin @every 1ms"} {
		if _, err := ParseSchedule(spec); err == nil || !strings.Contains(err.Error(), "at least 1s") {
			t.Errorf("schedule %q: %v, want refused naming the 1s floor", spec, err)
		}
	}
	for _, spec := range []string{"@every 1s", "TZ=UTC @every 2s"} {
		if _, err := ParseSchedule(spec); err != nil {
			t.Errorf("schedule %q refused: %v", spec, err)
		}
	}
}

// FuzzParseSchedule: any string either parses into a schedule that fires
// after the time it is asked about, or is an error; nothing panics.
func FuzzParseSchedule(f *testing.F) {
	for _, seed := range []string{
		"*/5 * * * *", "@every 10s", "@every 1h30m", "@daily", "CRON_TZ=UTC", "TZ=0", "TZ=0 * * * *",
		"CRON_TZ=Europe/Berlin 0 3 * * *", "CRON_TZ=UTC\t* * * * *", "0 0 30 2 *", "0 0 29 2 *",
		"", " ", "@", "@every", "@every -1s", "* * * *", "61 * * * *", "1-70 * * * *", "*/0 * * * *",
		"0 0 1 1 MON-SUN", "TZ=../../etc/passwd * * * * *", "CRON_TZ=UTC CRON_TZ=UTC * * * * *",
	} {
		f.Add(seed)
	}
	from := time.Date(2026, 11, 24, 0, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, spec string) {
		s, err := ParseSchedule(spec)
		if err != nil {
			if s != nil {
				t.Fatalf("%q: schedule and error %v", spec, err)
			}
			return
		}
		if next := s.Next(from); !next.After(from) {
			t.Fatalf("%q accepted, but its next fire after %s is %s", spec, from, next)
		}
	})
}
