package httpapi

import (
	"net"
	"net/http"
)

// Loopback reports whether the listen address addr (host:port) is
// reachable from this host only: 127.0.0.0/8, ::1 or "localhost". An empty
// host and the unspecified addresses (0.0.0.0, ::) listen on every
// interface and are not loopback; so is any host name but "localhost".
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// refusePayloads answers 403 naming http.auth_token_file. It stands in
// for the paths that serve event payloads or the process's internals
// (/dead, /dead/{id}, /debug/pprof/) on an address off loopback without
// http.auth_token, where anyone who reaches the port would read them.
func refusePayloads(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusForbidden, map[string]string{
		"error": "refused: http.addr is not a loopback address and no bearer token is set; " +
			"set http.auth_token_file (or http.auth_token) to serve this path",
	})
}
