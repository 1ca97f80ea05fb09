package dispatch

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
)

// Failure reasons, the values FailureReason returns (a metric's label):
// a bounded set, never a receiver's text.
const (
	ReasonHTTP3xx    = "http_3xx"   // a redirect (never followed)
	ReasonHTTP4xx    = "http_4xx"   // the receiver refused the request (429 and 408 included)
	ReasonHTTP5xx    = "http_5xx"   // the receiver failed
	ReasonTimeout    = "timeout"    // no answer in time (the request's timeout or the lease's deadline)
	ReasonRefused    = "refused"    // the connection was refused
	ReasonConnection = "connection" // the connection failed otherwise (reset, closed, DNS, TLS)
	ReasonRejected   = "rejected"   // a permanent refusal without an HTTP status (a broker's, the row's own)
	ReasonOther      = "other"
)

// FailureReasons lists every value FailureReason returns.
var FailureReasons = []string{ReasonHTTP3xx, ReasonHTTP4xx, ReasonHTTP5xx, ReasonTimeout, ReasonRefused, ReasonConnection, ReasonRejected, ReasonOther}

// ErrDeadlinePassed: a request was not written because its context's
// deadline (for outboxd, the lock's trust deadline) had passed when the
// bytes were about to reach the socket. FailureReason counts it a timeout.
var ErrDeadlinePassed = errors.New("dispatch: deadline passed before the request was written")

// ErrInterim: the receiver answered with an interim (1xx) status other
// than 100 Continue or 103 Early Hints, or switched protocols (101): the
// request has no final status, so it is not delivered. FailureReason
// counts it a connection failure.
var ErrInterim = errors.New("interim or protocol-switching answer instead of a final status")

// FailureReason classifies a failed send's error into one of
// FailureReasons.
func FailureReason(err error) string {
	switch code := httpStatus(err); {
	case code >= 500:
		return ReasonHTTP5xx
	case code >= 400:
		return ReasonHTTP4xx
	case code >= 300:
		return ReasonHTTP3xx
	}
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, ErrDeadlinePassed),
		errors.As(err, &ne) && ne.Timeout():
		return ReasonTimeout
	case errors.Is(err, syscall.ECONNREFUSED):
		return ReasonRefused
	case ne != nil, errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, ErrInterim),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return ReasonConnection
	case IsPermanent(err):
		return ReasonRejected
	}
	return ReasonOther
}

// httpStatus is the receiver's status carried by an *Error in err's
// chain; 0 when none.
func httpStatus(err error) int {
	for err != nil {
		if e, ok := err.(*Error); ok && e.Status != 0 {
			return e.Status
		}
		err = errors.Unwrap(err)
	}
	return 0
}
