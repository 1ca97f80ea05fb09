package config

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

const (
	envPrefix = "OUTBOXD_"
	// testEnvPrefix starts the variables only the test suites read.
	testEnvPrefix = "OUTBOXD_TEST_"
)

// envName is the environment variable that sets key.
func envName(key string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

// checkEnvNames refuses an OUTBOXD_* variable in environ that sets none of
// keys (a typo would otherwise be ignored without a word), naming it and
// the nearest key when one is close. OUTBOXD_TEST_* is left alone.
func checkEnvNames(environ, keys []string) error {
	known := map[string]string{}
	for _, k := range keys {
		known[envName(k)] = k
	}
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, envPrefix) || strings.HasPrefix(name, testEnvPrefix) {
			continue
		}
		if _, ok := known[name]; ok {
			continue
		}
		err := fmt.Errorf("no configuration key is set by this environment variable")
		if near, ok := nearest(name, known); ok {
			err = fmt.Errorf("%w; did you mean %s (key %s)?", err, near, known[near])
		}
		return &KeyError{Key: name, Err: err}
	}
	return nil
}

// nearest returns the name in known closest to name, when it is close: at
// most a few edits, fewer than a quarter of its length.
func nearest(name string, known map[string]string) (string, bool) {
	best, bestD := "", -1
	for _, k := range slices.Sorted(maps.Keys(known)) {
		if d := editDistance(name, k); bestD < 0 || d < bestD {
			best, bestD = k, d
		}
	}
	limit := min(3, len(strings.TrimPrefix(name, envPrefix))/4)
	return best, bestD >= 0 && bestD <= max(limit, 1)
}

// editDistance is the Levenshtein distance between a and b (bytes).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}
