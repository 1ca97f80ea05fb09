package config

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A Postgres DSN is redacted by parsing it, never by pattern: a password
// may hold spaces, quotes, '#' or '@', and a pattern that misses one shows
// the whole DSN. The scanners below follow pgconn's own rules (libpq's URI
// and keyword/value grammars) to find where each value sits in the text,
// and pgx's parser is asked as well: when the two disagree about the
// password, nothing of the DSN is shown.

const (
	dsnMask       = "redacted"
	unparsableDSN = "[redacted: unparsable DSN]"
)

// dsnSetting is one setting found in a DSN: its canonical key, its decoded
// value, and where its raw value sits in the DSN text (quotes included).
type dsnSetting struct {
	key        string
	val        string
	start, end int
}

// secret reports whether the setting holds a secret (password, sslpassword).
func (s dsnSetting) secret() bool { return strings.Contains(s.key, "password") }

func isURLDSN(dsn string) bool {
	return strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
}

// dsnForm names the form pgx reads dsn in, for messages.
func dsnForm(dsn string) string {
	if isURLDSN(dsn) {
		return "URL"
	}
	return "key=value"
}

// scanDSN returns dsn's settings in text order. Its errors never quote the
// DSN: a misplaced password could be any part of it.
func scanDSN(dsn string) ([]dsnSetting, error) {
	if strings.IndexByte(dsn, 0) >= 0 {
		return nil, errors.New("it contains a NUL byte")
	}
	if isURLDSN(dsn) {
		return scanURLDSN(dsn)
	}
	return scanKeywordDSN(dsn)
}

// scanURLDSN follows pgconn's parseURLSettings: userinfo up to the first '@'
// before any '/', a comma-separated host list, /dbname, then ?key=value&...
func scanURLDSN(dsn string) ([]dsnSetting, error) {
	p := strings.TrimPrefix(strings.TrimPrefix(dsn, "postgresql://"), "postgres://")
	out, p, err := scanURLUserinfo(p, len(dsn)-len(p))
	if err != nil {
		return nil, err
	}
	if p, err = skipURLHosts(p); err != nil {
		return nil, err
	}
	if strings.HasPrefix(p, "/") {
		p = p[indexOrLen(p, "?"):]
	}
	if !strings.HasPrefix(p, "?") {
		return out, nil
	}
	params, err := scanURLQuery(p[1:], len(dsn)-len(p)+1)
	if err != nil {
		return nil, err
	}
	return append(out, params...), nil
}

// scanURLUserinfo reads user[:password]@ at the start of p, which sits at
// offset off in the DSN, and returns the password setting, if any, and the
// text after the '@'. Without an '@' before any '/', p has no userinfo.
func scanURLUserinfo(p string, off int) ([]dsnSetting, string, error) {
	i := strings.IndexAny(p, "@/")
	if i < 0 || p[i] != '@' {
		return nil, p, nil
	}
	user, pw, hasPW := strings.Cut(p[:i], ":")
	if _, err := uriDecode(user); err != nil {
		return nil, "", fmt.Errorf("the user name %w", err)
	}
	if !hasPW || pw == "" {
		return nil, p[i+1:], nil
	}
	v, err := uriDecode(pw)
	if err != nil {
		return nil, "", fmt.Errorf("the password %w", err)
	}
	start := off + len(user) + 1
	return []dsnSetting{{key: "password", val: v, start: start, end: start + len(pw)}}, p[i+1:], nil
}

// skipURLHosts passes the comma-separated host[:port] list at the start
// of p and returns the text after it.
func skipURLHosts(p string) (string, error) {
	for {
		var err error
		if p, err = skipURLHost(p); err != nil {
			return "", err
		}
		if strings.HasPrefix(p, ":") {
			p = p[1:]
			p = p[indexOrLen(p, "/?,"):]
		}
		if !strings.HasPrefix(p, ",") {
			return p, nil
		}
		p = p[1:]
	}
}

// skipURLHost passes one host name or [IPv6 address] at the start of p.
func skipURLHost(p string) (string, error) {
	if !strings.HasPrefix(p, "[") {
		return p[indexOrLen(p, ":/?,"):], nil
	}
	end := strings.IndexByte(p, ']')
	if end < 0 {
		return "", errors.New("an IPv6 host has no closing ']'")
	}
	if end == 1 {
		return "", errors.New("an IPv6 host is empty")
	}
	p = p[end+1:]
	if p != "" && !strings.ContainsAny(p[:1], ":/?,") {
		return "", errors.New("unexpected text after an IPv6 host")
	}
	return p, nil
}

// scanURLQuery reads the key=value&... list query, which sits at offset
// off in the DSN.
func scanURLQuery(query string, off int) ([]dsnSetting, error) {
	var out []dsnSetting
	for p := query; p != ""; {
		pair := p[:indexOrLen(p, "&")]
		start := off + len(query) - len(p)
		p = strings.TrimPrefix(p[len(pair):], "&")
		set, err := scanURLParam(pair, start)
		if err != nil {
			return nil, err
		}
		out = append(out, set)
	}
	return out, nil
}

// scanURLParam reads one key=value pair, which sits at offset start in the DSN.
func scanURLParam(pair string, start int) (dsnSetting, error) {
	rawKey, rawVal, ok := strings.Cut(pair, "=")
	if !ok {
		return dsnSetting{}, errors.New("a query parameter has no '='")
	}
	if strings.Contains(rawVal, "=") {
		return dsnSetting{}, errors.New("a query parameter has more than one '=' (percent-encode it as %3D)")
	}
	key, err := uriDecode(rawKey)
	if err != nil {
		return dsnSetting{}, fmt.Errorf("a query parameter name %w", err)
	}
	key = canonicalKey(key)
	val, err := uriDecode(rawVal)
	if err != nil {
		return dsnSetting{}, fmt.Errorf("the value of query parameter %q %w", key, err)
	}
	vs := start + len(rawKey) + 1
	return dsnSetting{key: key, val: val, start: vs, end: vs + len(rawVal)}, nil
}

func indexOrLen(s, chars string) int {
	if i := strings.IndexAny(s, chars); i >= 0 {
		return i
	}
	return len(s)
}

// uriDecode follows pgconn's (libpq's) percent-decoding: %XX with two hex
// digits, no %00, leading and trailing spaces dropped, none inside.
func uriDecode(raw string) (string, error) {
	raw = strings.Trim(raw, " ")
	if strings.Contains(raw, " ") {
		return "", errors.New("contains a space (percent-encode it as %20)")
	}
	var b strings.Builder
	for i := 0; i < len(raw); i++ {
		if raw[i] != '%' {
			b.WriteByte(raw[i])
			continue
		}
		if i+2 >= len(raw) || !isHex(raw[i+1]) || !isHex(raw[i+2]) {
			return "", errors.New("has a '%' not followed by two hex digits (percent-encode '%' as %25)")
		}
		c := unhex(raw[i+1])<<4 | unhex(raw[i+2])
		if c == 0 {
			return "", errors.New("contains %00")
		}
		b.WriteByte(c)
		i += 2
	}
	return b.String(), nil
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

func unhex(c byte) byte {
	switch {
	case c >= 'a':
		return c - 'a' + 10
	case c >= 'A':
		return c - 'A' + 10
	default:
		return c - '0'
	}
}

func canonicalKey(k string) string {
	if k == "dbname" {
		return "database"
	}
	return k
}

const dsnSpace = " \t\n\r\v\f"

// scanKeywordDSN follows pgconn's parseKeywordValueSettings: key = value
// pairs separated by whitespace; a value is a run of non-space characters or
// a single-quoted string, with backslash escapes in both.
func scanKeywordDSN(dsn string) ([]dsnSetting, error) {
	s := strings.TrimLeft(dsn, dsnSpace)
	var out []dsnSetting
	for s != "" {
		eq := strings.IndexByte(s, '=')
		if eq < 0 {
			return nil, errors.New("it has text that is not key=value")
		}
		key := strings.Trim(s[:eq], dsnSpace)
		if strings.ContainsAny(key, dsnSpace) {
			return nil, errors.New("a value holds a space but is not quoted")
		}
		if key == "" {
			return nil, errors.New("it has a '=' with no key before it")
		}
		s = strings.TrimLeft(s[eq+1:], dsnSpace)
		start := len(dsn) - len(s)
		var raw string
		switch {
		case s == "":
		case s[0] != '\'':
			raw = s[:unquotedEnd(s)]
		default:
			end, ok := quotedEnd(s)
			if !ok {
				return nil, errors.New("a quoted value has no closing quote")
			}
			raw = s[:end]
		}
		s = strings.TrimLeft(s[len(raw):], dsnSpace)
		key, val := canonicalKey(key), unescapeKeyword(raw)
		if key == "user" && val == "" {
			continue // pgx ignores an empty user
		}
		out = append(out, dsnSetting{key: key, val: val, start: start, end: start + len(raw)})
	}
	return out, nil
}

// unquotedEnd is the length of the unquoted value at the start of s.
func unquotedEnd(s string) int {
	i := 0
	for i < len(s) && !strings.ContainsRune(dsnSpace, rune(s[i])) {
		if s[i] == '\\' {
			i++
		}
		i++
	}
	return min(i, len(s))
}

// quotedEnd is the length of the quoted value at the start of s, closing
// quote included.
func quotedEnd(s string) (int, bool) {
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '\'':
			return i + 1, true
		}
	}
	return 0, false
}

// unescapeKeyword turns a raw keyword/value value into its value: quotes
// removed, each backslash dropped and the character after it kept.
func unescapeKeyword(raw string) string {
	if strings.HasPrefix(raw, "'") {
		raw = raw[1 : len(raw)-1]
	}
	var b strings.Builder
	for i := 0; i < len(raw); i++ {
		if raw[i] == '\\' {
			i++
			if i == len(raw) {
				break
			}
		}
		b.WriteByte(raw[i])
	}
	return b.String()
}

// RedactDSN returns dsn, URL or key=value form, with its password and
// sslpassword replaced by "redacted" and everything else as written. A DSN
// that pgx cannot parse is shown as a placeholder, never as text.
func RedactDSN(dsn string) string {
	if dsn == "" {
		return ""
	}
	out, err := redactDSN(dsn)
	if err != nil {
		return unparsableDSN
	}
	return out
}

func redactDSN(dsn string) (string, error) {
	settings, err := scanDSN(dsn)
	if err != nil {
		return "", err
	}
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return "", err
	}
	if err := agreeOnPassword(dsn, cfg.Password, settings); err != nil {
		return "", err
	}
	var b strings.Builder
	last := 0
	for _, s := range settings {
		if !s.secret() || s.val == "" {
			continue
		}
		b.WriteString(dsn[last:s.start])
		b.WriteString(dsnMask)
		last = s.end
	}
	b.WriteString(dsn[last:])
	out := b.String()
	// The rewrite must read back with every secret now the mask.
	again, err := scanDSN(out)
	if err != nil || len(again) != len(settings) {
		return "", errors.New("redacted DSN does not read back")
	}
	for _, s := range again {
		if s.secret() && s.val != "" && s.val != dsnMask {
			return "", errors.New("redacted DSN still holds a secret")
		}
	}
	return out, nil
}

// agreeOnPassword checks the scan against pgx's reading of the same DSN:
// the password the scan found must be the one pgx uses; if the scan found
// none, a password pgx uses must have come from elsewhere (PGPASSWORD,
// .pgpass, a service file), not from text the scan did not recognise.
func agreeOnPassword(dsn, pgxPassword string, settings []dsnSetting) error {
	found, scanned := "", false
	for _, s := range settings {
		if s.key == "password" {
			found, scanned = s.val, true
		}
	}
	switch {
	case scanned && found != "" && found != pgxPassword:
		return errors.New("pgx reads a different password than the redactor")
	case !scanned && pgxPassword != "" && pgxPassword != os.Getenv("PGPASSWORD") && strings.Contains(dsn, pgxPassword):
		return errors.New("pgx reads a password the redactor did not find")
	}
	return nil
}

// validateDSN checks dsn the way store.Open will read it (pgxpool's parser)
// and explains a failure without quoting the DSN or its password.
func validateDSN(dsn string) error {
	form := dsnForm(dsn)
	settings, err := scanDSN(dsn)
	if err != nil {
		return fmt.Errorf("cannot be parsed as a %s DSN: %w%s", form, err, dsnHint(form))
	}
	if _, err := pgxpool.ParseConfig(dsn); err != nil {
		return fmt.Errorf("pgx rejects this %s DSN: %s%s", form, pgxReason(err, settings), dsnHint(form))
	}
	return nil
}

func dsnHint(form string) string {
	if form == "URL" {
		return " (want postgres://user:password@host:5432/db?sslmode=disable, reserved characters percent-encoded; the DSN is not shown, it may hold a password)"
	}
	return " (want host=h port=5432 user=u password='quote it if it holds spaces' dbname=db; the DSN is not shown, it may hold a password)"
}

// pgxReason is pgx's explanation without the connection string it quotes
// (redacted by pgx only on a best-effort basis), and withheld if it still
// contains a secret or concerns the syntax, where it can quote a fragment of
// a misplaced password.
func pgxReason(err error, settings []dsnSetting) string {
	const withheld = "pgx's message is withheld (it may quote the password)"
	var pe *pgconn.ParseConfigError
	if !errors.As(err, &pe) {
		return withheld
	}
	bare := *pe
	bare.ConnString = ""
	reason := strings.TrimPrefix(bare.Error(), "cannot parse ``: ")
	if strings.HasPrefix(reason, "failed to parse as") {
		return withheld
	}
	for _, s := range settings {
		if s.secret() && s.val != "" && strings.Contains(reason, s.val) {
			return withheld
		}
	}
	return reason
}
