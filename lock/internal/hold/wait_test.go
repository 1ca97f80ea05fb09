package hold

import (
	"context"
	"errors"
	"testing"
	"time"
)

var (
	errTaken   = errors.New("taken")
	errCorrupt = errors.New("corrupt")
)

// script is an Attempt that answers from a list, one answer a call, and
// counts its calls; past the list it keeps answering errTaken.
type script struct {
	answers []error
	final   []bool
	calls   int
}

func (s *script) try() (int, bool, error) {
	i := s.calls
	s.calls++
	if i >= len(s.answers) {
		return 0, false, errTaken
	}
	if s.answers[i] == nil {
		return i + 1, false, nil
	}
	return 0, i < len(s.final) && s.final[i], s.answers[i]
}

func TestWait(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		answers  []error
		final    []bool
		atOnce   bool
		wakes    int  // wakes sent before the wait starts (the channel holds one)
		closed   bool // the wake channel is closed
		interval time.Duration
		wantLock int
		wantErr  error
		wantCall int
	}{
		{name: "at once finds it free", answers: []error{nil}, atOnce: true, interval: time.Hour, wantLock: 1, wantCall: 1},
		{name: "a wake retries before the interval", answers: []error{errTaken, nil}, atOnce: true, wakes: 1, interval: time.Hour, wantLock: 2, wantCall: 2},
		{name: "without atOnce the first attempt waits for a wake", answers: []error{nil}, wakes: 1, interval: time.Hour, wantLock: 1, wantCall: 1},
		{name: "a final error ends the wait as it is", answers: []error{errCorrupt}, final: []bool{true}, atOnce: true, interval: time.Hour, wantErr: errCorrupt, wantCall: 1},
		{name: "the timer retries", answers: []error{errTaken, errTaken, nil}, atOnce: true, interval: time.Millisecond, wantLock: 3, wantCall: 3},
		{name: "a closed wake leaves the timer", answers: []error{nil}, closed: true, interval: time.Millisecond, wantLock: 1, wantCall: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := &script{answers: tc.answers, final: tc.final}
			wake := make(chan struct{}, 1)
			for range tc.wakes {
				wake <- struct{}{}
			}
			if tc.closed {
				close(wake)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			l, err := Wait(ctx, tc.interval, errTaken, wake, tc.atOnce, s.try)
			if l != tc.wantLock || !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) || s.calls != tc.wantCall {
				t.Fatalf("Wait = %d, %v after %d attempts; want %d, %v after %d", l, err, s.calls, tc.wantLock, tc.wantErr, tc.wantCall)
			}
		})
	}
}

// On the wait's end the error is the last attempt's that the end did not
// cut short, joined with the context's cause.
func TestWaitEndKeepsTheLastErrorThatLearnedSomething(t *testing.T) {
	t.Parallel()
	learned := errors.New("held by replica-b")
	cause := errors.New("wait over")
	ctx, cancel := context.WithCancelCause(context.Background())
	calls := 0
	try := func() (int, bool, error) {
		calls++
		if calls == 1 {
			return 0, false, learned
		}
		cancel(cause) // this attempt is cut short by the end
		return 0, false, errors.New("context canceled mid-attempt")
	}
	wake := make(chan struct{}, 1)
	wake <- struct{}{}
	_, err := Wait(ctx, time.Hour, errTaken, wake, true, try)
	if !errors.Is(err, learned) || !errors.Is(err, cause) || calls != 2 {
		t.Fatalf("Wait error %v after %d attempts; want %v joined with %v after 2", err, calls, learned, cause)
	}
}
