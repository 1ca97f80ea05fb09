package dispatch

import (
	"context"
	"errors"
	"net"
	"regexp"
	"time"
)

// timedErr is a failed send's error with how long the send took.
type timedErr struct {
	err error
	d   time.Duration
}

func (t *timedErr) Error() string { return t.err.Error() }
func (t *timedErr) Unwrap() error { return t.err }

// WithDuration attaches a send's duration to its error (nil stays nil);
// the error's text and what it wraps are unchanged.
func WithDuration(err error, d time.Duration) error {
	if err == nil {
		return nil
	}
	return &timedErr{err: err, d: d}
}

// SendDuration is how long the failed send of err took, if the sink
// measured it (WithDuration).
func SendDuration(err error) (time.Duration, bool) {
	var t *timedErr
	if errors.As(err, &t) {
		return t.d, true
	}
	return 0, false
}

// answered finds an HTTP status a receiver answered in a failure's text.
var answered = regexp.MustCompile(`receiver answered (\d{3})\b`)

// FailureKind names what kind of failure err is, for a row's attempt
// history: "http_<status>" when a receiver answered with a status,
// "timeout", "connection" (refused, reset, unreachable, DNS), "no_route",
// else "permanent" or "error" as the sink advised.
func FailureKind(err error) string {
	if err == nil {
		return "error"
	}
	if m := answered.FindStringSubmatch(err.Error()); m != nil {
		return "http_" + m[1]
	}
	var ne net.Error
	switch {
	case errors.Is(err, ErrNoRoute):
		return "no_route"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.As(err, new(*net.OpError)), errors.As(err, new(*net.DNSError)):
		return "connection"
	case IsPermanent(err):
		return "permanent"
	}
	return "error"
}
