package dispatch

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// Clip keeps short text as is, cuts long text to n bytes plus a mark, and
// never splits a rune (last_error must stay valid UTF-8).
func TestClip(t *testing.T) {
	t.Parallel()
	if got := Clip("short", 10); got != "short" {
		t.Errorf("Clip(short) = %q", got)
	}
	if got := Clip(strings.Repeat("a", 20), 10); got != strings.Repeat("a", 10)+"…" {
		t.Errorf("Clip(20 a, 10) = %q", got)
	}
	s := strings.Repeat("é", 10) // 2 bytes each
	for n := range len(s) {
		got := Clip(s, n)
		if !utf8.ValidString(got) || len(strings.TrimSuffix(got, "…")) > n {
			t.Errorf("Clip(%q, %d) = %q: invalid UTF-8 or longer than %d bytes", s, n, got, n)
		}
	}
}
