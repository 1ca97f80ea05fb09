package httpapi

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/admin"
)

// Token is a named bearer token: http.auth_token is named "default", each
// line "name:token" of http.auth_tokens_file one more.
type Token struct {
	Name, Value string
}

// tokens are the accepted bearer tokens, hashed.
type tokens struct {
	names []string
	sums  [][sha256.Size]byte
}

func newTokens(ts []Token) tokens {
	var t tokens
	for _, x := range ts {
		if x.Value == "" {
			continue
		}
		t.names = append(t.names, x.Name)
		t.sums = append(t.sums, sha256.Sum256([]byte(x.Value)))
	}
	return t
}

// who returns the name of the token r carries as "Authorization: Bearer
// <token>" (the scheme in any case, as RFC 7235 has it). The comparison
// takes the same time whatever the presented token (both sides hashed,
// every accepted token compared in constant time), so neither a token nor
// its length can be guessed from the answer's timing.
func (t tokens) who(r *http.Request) (string, bool) {
	got, ok := bearer(r.Header.Get("Authorization"))
	sum := sha256.Sum256([]byte(got))
	name, found := "", 0
	for i, want := range t.sums {
		if subtle.ConstantTimeCompare(sum[:], want[:]) == 1 {
			name, found = t.names[i], 1
		}
	}
	return name, ok && found == 1
}

// unauthorized answers 401 with a WWW-Authenticate challenge.
func unauthorized(w http.ResponseWriter, why string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="outboxd"`)
	writeJSON(w, http.StatusUnauthorized, map[string]string{"error": why})
}

// requireToken serves h only to a request carrying one of the tokens; any
// other gets 401. Without tokens it serves h to everyone.
func requireToken(t tokens, h http.HandlerFunc) http.HandlerFunc {
	if len(t.sums) == 0 {
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) {
		if _, ok := t.who(r); !ok {
			unauthorized(w, "missing or wrong bearer token (http.auth_token)")
			return
		}
		h(w, r)
	}
}

// requireWriter serves a write only to a request carrying one of the
// tokens, naming its token as the caller; any other gets 401, on every
// address, and so does every request when no token is set.
func requireWriter(t tokens, h func(http.ResponseWriter, *http.Request, admin.Caller)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		name, ok := t.who(r)
		if !ok || len(t.sums) == 0 {
			unauthorized(w, "a write needs a bearer token (http.auth_token or http.auth_tokens_file); missing or wrong")
			return
		}
		h(w, r, admin.Caller{Name: name})
	}
}

// bearer returns the credentials of an "Authorization: Bearer <token>"
// header value; the scheme's name is case-insensitive.
func bearer(header string) (string, bool) {
	scheme, token, ok := strings.Cut(header, " ")
	return token, ok && strings.EqualFold(scheme, "Bearer")
}
