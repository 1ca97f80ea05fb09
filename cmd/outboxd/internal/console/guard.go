package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// guard lets a browser in with http.auth_token and protects every write
// from a forged request. Guarantees: a page is served only to a request
// carrying a session cookie this process signed after a login with the
// token (when a token is set); a write (POST) is served only when, in
// addition, its form carries the CSRF field derived from that session and
// net/http's cross-origin protection finds it same-origin. The cookie is
// HttpOnly and SameSite=Strict; the signing secret is drawn at start and
// lives in memory only, so a restart ends every session.
type guard struct {
	token  [sha256.Size]byte // sha256 of http.auth_token; zero when none
	hasTok bool
	secret []byte
	now    func() time.Time
	origin *http.CrossOriginProtection
}

// sessionCookie is the console's cookie; sessionLife how long a login lasts.
const (
	sessionCookie = "outboxd_console"
	sessionLife   = 12 * time.Hour
	csrfField     = "csrf"
)

func newGuard(token string, now func() time.Time) *guard {
	g := &guard{secret: make([]byte, 32), now: now, origin: http.NewCrossOriginProtection()}
	_, _ = rand.Read(g.secret) // crypto/rand.Read never fails (Go ≥ 1.24)
	if token != "" {
		g.token, g.hasTok = sha256.Sum256([]byte(token)), true
	}
	return g
}

// tokenOK compares a presented token with http.auth_token in constant
// time (both hashed first, so neither the token nor its length leaks).
func (g *guard) tokenOK(presented string) bool {
	sum := sha256.Sum256([]byte(presented))
	return g.hasTok && subtle.ConstantTimeCompare(sum[:], g.token[:]) == 1
}

func (g *guard) sign(parts ...string) string {
	m := hmac.New(sha256.New, g.secret)
	m.Write([]byte(strings.Join(parts, "\x00")))
	return hex.EncodeToString(m.Sum(nil))
}

// login sets a new session cookie (after tokenOK).
func (g *guard) login(w http.ResponseWriter, r *http.Request) {
	issued := strconv.FormatInt(g.now().Unix(), 10)
	http.SetCookie(w, &http.Cookie{
		Name: sessionCookie, Value: issued + "." + g.sign("session", issued), Path: "/ui",
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil, MaxAge: int(sessionLife.Seconds()),
	})
}

func logout(w http.ResponseWriter) {
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/ui", HttpOnly: true, SameSite: http.SameSiteStrictMode, MaxAge: -1})
}

// session returns r's valid session cookie value, or "".
func (g *guard) session(r *http.Request) string {
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return ""
	}
	issued, mac, ok := strings.Cut(c.Value, ".")
	at, err := strconv.ParseInt(issued, 10, 64)
	if !ok || err != nil || !hmac.Equal([]byte(mac), []byte(g.sign("session", issued))) {
		return ""
	}
	if age := g.now().Sub(time.Unix(at, 0)); age < 0 || age > sessionLife {
		return ""
	}
	return c.Value
}

// signedIn: r may read every page and see payloads; with no token set
// nobody is signed in.
func (g *guard) signedIn(r *http.Request) bool { return g.hasTok && g.session(r) != "" }

// csrf is the form field value for r's session ("" without one).
func (g *guard) csrf(r *http.Request) string {
	s := g.session(r)
	if s == "" {
		return ""
	}
	return g.sign("csrf", s)
}

// writeRefusal says why the write r must not be served, or "" when it may.
func (g *guard) writeRefusal(r *http.Request) string {
	if err := g.origin.Check(r); err != nil {
		return "refused: a cross-origin request"
	}
	if !g.hasTok {
		return "refused: changes from the console need http.auth_token (or http.auth_token_file)"
	}
	want := g.csrf(r)
	if want == "" {
		return "refused: not signed in (or the session ended)"
	}
	if !hmac.Equal([]byte(r.PostFormValue(csrfField)), []byte(want)) {
		return "refused: the form's CSRF field is missing or stale; reload the page and try again"
	}
	return ""
}
