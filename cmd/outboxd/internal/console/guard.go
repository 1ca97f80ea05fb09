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

// guard lets a browser in with a bearer token (http.auth_token or a
// named one of http.auth_tokens_file) and protects every write from a
// forged request. Guarantees: a page is served only to a request carrying
// a session cookie this process signed after a login with one of the
// tokens (when a token is set), and the session names that token; a write
// (POST) is served only when, in addition, its form carries the CSRF field
// derived from that session and net/http's cross-origin protection finds
// it same-origin. The cookie is HttpOnly and SameSite=Strict; the signing
// secret is drawn at start and lives in memory only, so a restart ends
// every session.
type guard struct {
	names  []string            // the tokens' names, in sums' order
	sums   [][sha256.Size]byte // sha256 of each token
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

func newGuard(tokens []Token, now func() time.Time) *guard {
	g := &guard{secret: make([]byte, 32), now: now, origin: http.NewCrossOriginProtection()}
	_, _ = rand.Read(g.secret) // crypto/rand.Read never fails (Go ≥ 1.24)
	for _, t := range tokens {
		if t.Value != "" {
			g.names, g.sums = append(g.names, t.Name), append(g.sums, sha256.Sum256([]byte(t.Value)))
		}
	}
	g.hasTok = len(g.sums) > 0
	return g
}

// tokenName returns the name of the token presented, if it is one of the
// tokens. The comparison takes the same time whatever is presented (both
// sides hashed, every token compared in constant time), so neither a
// token nor its length leaks.
func (g *guard) tokenName(presented string) (string, bool) {
	sum := sha256.Sum256([]byte(presented))
	name, found := "", 0
	for i, want := range g.sums {
		if subtle.ConstantTimeCompare(sum[:], want[:]) == 1 {
			name, found = g.names[i], 1
		}
	}
	return name, found == 1
}

func (g *guard) sign(parts ...string) string {
	m := hmac.New(sha256.New, g.secret)
	m.Write([]byte(strings.Join(parts, "\x00")))
	return hex.EncodeToString(m.Sum(nil))
}

// login sets a new session cookie for the token named name (after
// tokenName). Names never hold ':' (http.auth_tokens_file's rule).
func (g *guard) login(w http.ResponseWriter, r *http.Request, name string) {
	issued := strconv.FormatInt(g.now().Unix(), 10)
	http.SetCookie(w, &http.Cookie{
		Name: sessionCookie, Value: issued + ":" + name + ":" + g.sign("session", issued, name), Path: "/ui",
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil, MaxAge: int(sessionLife.Seconds()),
	})
}

func logout(w http.ResponseWriter) {
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/ui", HttpOnly: true, SameSite: http.SameSiteStrictMode, MaxAge: -1})
}

// session returns r's valid session cookie value and the name of the
// token it was signed in with, or "", "".
func (g *guard) session(r *http.Request) (value, name string) {
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return "", ""
	}
	parts := strings.Split(c.Value, ":")
	if len(parts) != 3 {
		return "", ""
	}
	issued, name, mac := parts[0], parts[1], parts[2]
	at, err := strconv.ParseInt(issued, 10, 64)
	if err != nil || !hmac.Equal([]byte(mac), []byte(g.sign("session", issued, name))) {
		return "", ""
	}
	if age := g.now().Sub(time.Unix(at, 0)); age < 0 || age > sessionLife {
		return "", ""
	}
	return c.Value, name
}

// who is the name of the token r's session was signed in with ("" when
// none).
func (g *guard) who(r *http.Request) string {
	_, name := g.session(r)
	return name
}

// signedIn: r may read every page and see payloads; with no token set
// nobody is signed in.
func (g *guard) signedIn(r *http.Request) bool {
	v, _ := g.session(r)
	return g.hasTok && v != ""
}

// csrf is the form field value for r's session ("" without one).
func (g *guard) csrf(r *http.Request) string {
	s, _ := g.session(r)
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
