package poller

import (
	"errors"
	"math"
	"math/big"
	"testing"
	"time"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/store"
)

// wantStep is step's definition in exact arithmetic: backoff_base doubled
// attempts-1 times (none below 1), capped at backoff_max, both read as at
// least 0.
func wantStep(attempts int, base, ceiling time.Duration) time.Duration {
	base, ceiling = max(base, 0), max(ceiling, 0)
	shift := 0
	if attempts > 1 {
		shift = min(attempts-1, 200) // 2^200·base passes any int64 cap
	}
	v := new(big.Int).Lsh(big.NewInt(int64(base)), uint(shift))
	if v.Cmp(big.NewInt(int64(ceiling))) > 0 {
		return ceiling
	}
	return time.Duration(v.Int64())
}

// step is total: any attempts (a row's value, negative or huge) and any
// durations give base·2^(n-1) capped at max, never a panic, a negative
// wait or an overflow.
func FuzzStep(f *testing.F) {
	for _, a := range []int{-1, -5, 0, 1, 2, 25, 40, 41, 63, 64, 65, math.MaxInt32, math.MaxInt, math.MinInt} {
		f.Add(a, int64(time.Second), int64(time.Hour))
	}
	f.Add(30, int64(time.Hour), int64(math.MaxInt64))
	f.Add(3, int64(-time.Second), int64(time.Hour))
	f.Add(3, int64(time.Second), int64(-1))
	f.Fuzz(func(t *testing.T, attempts int, base, ceiling int64) {
		p := &Poller{cfg: Config{BackoffBase: time.Duration(base), BackoffMax: time.Duration(ceiling)}}
		got := p.step(attempts)
		if want := wantStep(attempts, time.Duration(base), time.Duration(ceiling)); got != want {
			t.Fatalf("step(%d) with base %d, max %d = %d, want %d", attempts, base, ceiling, got, want)
		}
	})
}

// failure is total over every attempts value a row can hold: a negative
// count counts from 0, a count at or past max_attempts dead-letters, and a
// retry is due within [step/2, max(step, Retry-After capped at max)].
func FuzzFailure(f *testing.F) {
	for _, a := range []int{-1, -5, math.MinInt32, math.MinInt, 0, 1, 23, 24, 25, math.MaxInt32, math.MaxInt} {
		f.Add(a, uint8(25), false, int64(0))
	}
	f.Add(-5, uint8(1), false, int64(0))
	f.Add(3, uint8(25), true, int64(0))
	f.Add(3, uint8(25), false, int64(10*time.Hour))
	f.Add(3, uint8(25), false, int64(math.MinInt64))
	f.Fuzz(func(t *testing.T, attempts int, maxAttempts uint8, permanent bool, retryAfter int64) {
		cfg := Config{MaxAttempts: int(maxAttempts), BackoffBase: time.Second, BackoffMax: time.Hour}.withDefaults()
		p := &Poller{cfg: cfg}
		it := item{row: store.Row{ID: 7, Attempts: attempts},
			err: &dispatch.Error{Err: errors.New("boom"), Permanent: permanent, RetryAfter: time.Duration(retryAfter)}}
		got := p.failure(it)
		prior := max(attempts, 0) // a negative count counts from 0
		if wantDead := permanent || prior >= cfg.MaxAttempts-1; got.Dead != wantDead {
			t.Fatalf("attempts %d, max %d, permanent %v: dead %v, want %v", attempts, cfg.MaxAttempts, permanent, got.Dead, wantDead)
		}
		if got.ID != 7 || got.Error != "boom" {
			t.Fatalf("failure %+v lost the row's id or error", got)
		}
		if got.Dead {
			return
		}
		step := wantStep(prior+1, cfg.BackoffBase, cfg.BackoffMax) // prior < MaxAttempts-1: no overflow
		lo, hi := step/2, max(step, min(time.Duration(retryAfter), cfg.BackoffMax))
		if got.Delay < lo || got.Delay > hi {
			t.Fatalf("attempts %d: retry in %s, want within [%s, %s]", attempts, got.Delay, lo, hi)
		}
	})
}
