// Package docscheck holds the tests that keep the repository speaking of the
// product alone: README.md, BENCHMARKS.md, docs/**/*.md and the comments of
// non-test Go files say what outboxd does and why, never how or when it was
// made (the patterns are workWords in the test), and every relative link in
// the Markdown files points at a file that exists.
package docscheck
