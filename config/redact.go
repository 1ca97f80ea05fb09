package config

import (
	"net/url"
	"strings"
)

const unparsableURL = "[redacted: unparsable URL]"

// secretParamWords mark a query parameter whose value is a credential
// (access_token, api_key, X-Amz-Signature, sig, password, auth, ...).
var secretParamWords = []string{"token", "key", "secret", "sig", "pass", "auth", "credential", "session", "code"}

// RedactURL returns raw with its userinfo password, the value of every query
// parameter whose name looks like a credential, and any fragment replaced
// by "redacted". A URL that does not parse is shown as a placeholder.
func RedactURL(raw string) string {
	if raw == "" {
		return ""
	}
	u, err := url.Parse(raw)
	if err != nil || u.Opaque != "" {
		return unparsableURL
	}
	if u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), dsnMask)
		} else if u.User.Username() != "" {
			// A user name alone is how many services carry a token.
			u.User = url.User(dsnMask)
		}
	}
	u.RawQuery = redactQuery(u.RawQuery)
	if u.Fragment != "" || u.RawFragment != "" {
		u.Fragment, u.RawFragment = dsnMask, ""
	}
	return u.String()
}

// redactQuery masks credential values in a raw query, leaving the rest as
// written. Pairs are split at '&' and ';' (some servers accept both).
func redactQuery(q string) string {
	if q == "" {
		return q
	}
	var b strings.Builder
	for q != "" {
		i := indexOrLen(q, "&;")
		pair := q[:i]
		name, _, _ := strings.Cut(pair, "=")
		if secretParam(name) {
			pair = name + "=" + dsnMask
		}
		b.WriteString(pair)
		if i < len(q) {
			b.WriteByte(q[i])
			i++
		}
		q = q[i:]
	}
	return b.String()
}

// redactValues is m with every value redacted (static headers: an API
// key, a bearer token); the names stay.
func redactValues(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = redactWhole(v)
	}
	return out
}

func secretParam(rawName string) bool {
	name, err := url.QueryUnescape(rawName)
	if err != nil {
		name = rawName
	}
	name = strings.ToLower(name)
	for _, w := range secretParamWords {
		if strings.Contains(name, w) {
			return true
		}
	}
	return false
}
