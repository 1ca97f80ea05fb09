package httpapi

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"
)

// requireToken serves h only to a request carrying "Authorization: Bearer
// <token>" (the scheme in any case, as RFC 7235 has it); any other gets
// 401 with a WWW-Authenticate challenge. The comparison takes the same
// time whatever the presented token (both sides hashed, then compared in
// constant time), so neither the token nor its length can be guessed from
// the answer's timing. An empty token serves h to everyone.
func requireToken(token string, h http.HandlerFunc) http.HandlerFunc {
	if token == "" {
		return h
	}
	want := sha256.Sum256([]byte(token))
	return func(w http.ResponseWriter, r *http.Request) {
		got, ok := bearer(r.Header.Get("Authorization"))
		sum := sha256.Sum256([]byte(got))
		if subtle.ConstantTimeCompare(sum[:], want[:]) != 1 || !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="outboxd"`)
			writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "missing or wrong bearer token (http.auth_token)"})
			return
		}
		h(w, r)
	}
}

// bearer returns the credentials of an "Authorization: Bearer <token>"
// header value; the scheme's name is case-insensitive.
func bearer(header string) (string, bool) {
	scheme, token, ok := strings.Cut(header, " ")
	return token, ok && strings.EqualFold(scheme, "Bearer")
}
