// Package docscheck holds the tests that keep the repository speaking of the
// product alone: README.md, BENCHMARKS.md, docs/**/*.md, the comments of
// every Go file (tests and the bench module included) and the test names
// and failure messages of _test.go files say what outboxd does and why,
// never how or when it was made (the patterns are workWords in the test),
// every relative link in the Markdown files points at a file that
// exists, and no page but docs/reference.md carries a table of the metrics
// or the log lines.
package docscheck
