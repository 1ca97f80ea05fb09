package blackbox

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"
)

// consoleClient is a browser-like HTTP client of one replica's console:
// its cookie jar, no redirects followed.
type consoleClient struct {
	t    *testing.T
	base string
	c    *http.Client
}

func newConsoleClient(t *testing.T, r *replica) *consoleClient {
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &consoleClient{t: t, base: "http://" + r.addr, c: &http.Client{Jar: jar, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// do sends a request with the extra headers and returns the status and body.
func (cc *consoleClient) do(method, path string, form url.Values, header ...string) (int, string) {
	cc.t.Helper()
	req, err := http.NewRequest(method, cc.base+path, strings.NewReader(form.Encode()))
	if err != nil {
		cc.t.Fatal(err)
	}
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := cc.c.Do(req)
	if err != nil {
		cc.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		cc.t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

var csrfValue = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// Every write of the console is refused without a signed-in session,
// without the session's CSRF field, from another origin, and with no
// token configured; a page needs the session when a token is set.
func TestConsoleRefusesWritesWithoutSessionCSRFOrSameOrigin(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rc := newRecorder(t, nil)
	e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", rc.URL(), "OUTBOXD_HTTP_AUTH_TOKEN", consoleToken)
	rep := e.start()
	paused := func() bool {
		var n int
		if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_paused_destinations`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	cc := newConsoleClient(t, rep)

	if code, _ := cc.do(http.MethodGet, "/ui", nil); code != http.StatusSeeOther {
		t.Errorf("GET /ui without a session: %d, want 303 to the sign-in form", code)
	}
	if code, _ := cc.do(http.MethodPost, "/ui/login", url.Values{"token": {"wrong"}}); code != http.StatusUnauthorized {
		t.Errorf("sign-in with a wrong token: %d, want 401", code)
	}
	if code, body := cc.do(http.MethodPost, "/ui/pause/default", url.Values{}); code != http.StatusForbidden {
		t.Errorf("pause without a session: %d, want 403: %s", code, trunc(body, 300))
	}
	if code, _ := cc.do(http.MethodPost, "/ui/login", url.Values{"token": {consoleToken}}); code != http.StatusSeeOther {
		t.Fatalf("sign-in: %d, want 303", code)
	}
	_, page := cc.do(http.MethodGet, "/ui", nil)
	m := csrfValue.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("the signed-in overview has no CSRF field: %s", trunc(page, 500))
	}
	cases := []struct {
		name   string
		form   url.Values
		header []string
	}{
		{"no CSRF field", url.Values{}, nil},
		{"a wrong CSRF field", url.Values{"csrf": {strings.Repeat("0", len(m[1]))}}, nil},
		{"another origin", url.Values{"csrf": {m[1]}}, []string{"Sec-Fetch-Site", "cross-site", "Origin", "http://elsewhere.example"}},
	}
	for _, c := range cases {
		if code, body := cc.do(http.MethodPost, "/ui/pause/default", c.form, c.header...); code != http.StatusForbidden || paused() {
			t.Errorf("pause with %s: %d (paused %v), want 403 and nothing paused: %s", c.name, code, paused(), trunc(body, 300))
		}
	}
	if code, body := cc.do(http.MethodPost, "/ui/pause/default", url.Values{"csrf": {m[1]}}, "Sec-Fetch-Site", "same-origin"); code != http.StatusSeeOther || !paused() {
		t.Fatalf("pause signed in with the CSRF field: %d (paused %v), want 303 and paused: %s", code, paused(), trunc(body, 300))
	}

	// No token configured: the console reads, and refuses every write.
	e.set("OUTBOXD_HTTP_AUTH_TOKEN", "", "OUTBOXD_HTTP_ADDR", freeAddr(t))
	open := newConsoleClient(t, e.start())
	if code, body := open.do(http.MethodGet, "/ui", nil); code != http.StatusOK || strings.Contains(body, `name="csrf"`) {
		t.Errorf("GET /ui without a token set: %d, want 200 without forms", code)
	}
	if code, body := open.do(http.MethodPost, "/ui/resume/default", url.Values{"csrf": {m[1]}}); code != http.StatusForbidden || !paused() {
		t.Errorf("resume without a token set: %d (paused %v), want 403: %s", code, paused(), trunc(body, 300))
	}
}

// A browser signs in with a named token of http.auth_tokens_file as with
// http.auth_token; its writes are logged with that token's name, and a
// session cookie whose name is changed is no session.
func TestConsoleSignsInWithANamedToken(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rc := newRecorder(t, nil)
	e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", rc.URL(), "OUTBOXD_HTTP_AUTH_TOKEN", consoleToken)
	withAdminToken(t, e)
	rep := e.start()
	cc := newConsoleClient(t, rep)
	if code, _ := cc.do(http.MethodPost, "/ui/login", url.Values{"token": {adminToken}}); code != http.StatusSeeOther {
		t.Fatalf("sign-in with the named token: %d, want 303", code)
	}
	_, page := cc.do(http.MethodGet, "/ui", nil)
	m := csrfValue.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("the signed-in overview has no CSRF field: %s", trunc(page, 500))
	}
	if code, body := cc.do(http.MethodPost, "/ui/pause/default", url.Values{"csrf": {m[1]}}, "Sec-Fetch-Site", "same-origin"); code != http.StatusSeeOther {
		t.Fatalf("pause: %d, want 303: %s", code, trunc(body, 300))
	}
	for _, msg := range []string{"console write", "admin write"} {
		if len(rep.logsMatching(func(_ string, rec map[string]any) bool {
			return rec["msg"] == msg && rec["caller"] == "console:oncall" && rec["op"] == "pause"
		})) != 1 {
			t.Errorf("no %q line naming the caller console:oncall: %s", msg, rep.tail(20))
		}
	}

	// The cookie names its token under the signature: renamed, it is no
	// session.
	u, err := url.Parse(cc.base + "/ui")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cc.c.Jar.Cookies(u) {
		if !strings.Contains(c.Value, ":oncall:") {
			t.Fatalf("the session cookie %s=%q does not name its token", c.Name, c.Value)
		}
		c.Value, c.Path = strings.Replace(c.Value, ":oncall:", ":default:", 1), "/ui"
		cc.c.Jar.SetCookies(u, []*http.Cookie{c})
	}
	if code, _ := cc.do(http.MethodGet, "/ui", nil); code != http.StatusSeeOther {
		t.Errorf("GET /ui with the cookie's token name changed: %d, want 303 to the sign-in form", code)
	}
}
