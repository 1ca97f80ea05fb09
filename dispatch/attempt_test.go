package dispatch_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/outboxd/outboxd/dispatch"
)

// A failure's kind for the attempt history, from what the sinks return;
// Timed keeps the error's text and advice and adds the send's duration.
func TestFailureKind(t *testing.T) {
	_, refused := net.Dial("tcp", "127.0.0.1:1") // nothing listens on port 1
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&dispatch.Error{Err: errors.New(`webhook: event 7: receiver answered 503 "Service Unavailable"`)}, "http_503"},
		{&dispatch.Error{Err: fmt.Errorf("webhook: event 7: POST x: %w", context.DeadlineExceeded)}, "timeout"},
		{&dispatch.Error{Err: fmt.Errorf("webhook: event 7: POST x: %w", refused)}, "connection"},
		{&dispatch.Error{Err: dispatch.ErrNoRoute, Permanent: true}, "no_route"},
		{&dispatch.Error{Err: errors.New("encode"), Permanent: true}, "permanent"},
		{errors.New("broker said no"), "error"},
	} {
		timed := dispatch.WithDuration(tc.err, 42*time.Millisecond)
		if got := dispatch.FailureKind(timed); got != tc.want {
			t.Errorf("FailureKind(%v) = %q, want %q", tc.err, got, tc.want)
		}
		if d, ok := dispatch.SendDuration(timed); !ok || d != 42*time.Millisecond {
			t.Errorf("SendDuration = %v %v, want 42ms", d, ok)
		}
		if timed.Error() != tc.err.Error() || dispatch.IsPermanent(timed) != dispatch.IsPermanent(tc.err) {
			t.Errorf("Timed changed the error: %q permanent %v", timed, dispatch.IsPermanent(timed))
		}
	}
	if dispatch.WithDuration(nil, time.Second) != nil {
		t.Error("WithDuration(nil) is not nil")
	}
}
