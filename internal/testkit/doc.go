// Package testkit holds test helpers that need no services, shared by the
// packages' tests instead of a copy in each:
//
//   - Logs, a log buffer written from many goroutines (a daemon's slog
//     handler, an exec.Cmd's copying goroutines) that a test can wait on
//     for a line instead of sleeping;
//   - Writer and Logger, which send log lines to t.Log and stop quietly
//     once the test is over;
//   - Receiver, a recording webhook receiver with per-request answers
//     (per aggregate, per attempt), held requests, and waits on what it
//     has seen; OrderViolations and TokenViolations check its requests
//     against the relay's guarantees (first deliveries in id order per
//     aggregate; no fencing token going back);
//   - WaitFor and Poll, a wait on a condition with a deadline.
//
// Real Postgres and Redis are internal/testenv's; this package imports
// nothing of outboxd, so any package's tests may use it.
package testkit
