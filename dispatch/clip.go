package dispatch

import "unicode/utf8"

// Clip cuts s to at most n bytes for an error text or a log field, marking
// the cut with "…". It cuts on a rune boundary, so a valid UTF-8 s stays
// valid (last_error must be). The caller quotes the result where it may hold
// anything.
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
