package console

import (
	"bytes"
	"encoding/json"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/admin"
	"github.com/outboxd/outboxd/cmd/outboxd/internal/deadquery"
	"github.com/outboxd/outboxd/store"
)

// pageNames are the templates/<name>.html pages, each drawn in layout.html.
var pageNames = []string{"overview", "dead", "row", "confirm", "result", "resend", "login", "message"}

var funcs = template.FuncMap{
	"ago":  func(t time.Time) string { return ago(t, time.Now()) },
	"when": func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") },
	"secs": func(v float64) string { return (time.Duration(v * float64(time.Second))).Round(time.Second).String() },
	"mins": func(d time.Duration) int { return int(d.Round(time.Minute).Minutes()) },
}

func parsePages() map[string]*template.Template {
	out := map[string]*template.Template{}
	for _, n := range pageNames {
		out[n] = template.Must(template.New("layout.html").Funcs(funcs).ParseFS(files, "templates/layout.html", "templates/"+n+".html"))
	}
	return out
}

// frame is what every page's layout reads.
type frame struct {
	Title    string
	SignedIn bool
	HasToken bool
	CSRF     string
	Refresh  int // seconds; 0: none
	Body     any
}

// render draws page name with body; a template error is a 500.
func (s *server) render(w http.ResponseWriter, r *http.Request, code int, name, title string, body any) {
	f := frame{Title: title, SignedIn: s.g.signedIn(r), HasToken: s.g.hasTok, CSRF: s.g.csrf(r), Body: body}
	if name == "overview" && r.URL.Query().Get("refresh") != "0" {
		f.Refresh = 5
	}
	s.draw(w, code, name, f)
}

// draw executes page name with f and writes it with code.
func (s *server) draw(w http.ResponseWriter, code int, name string, f frame) {
	var buf bytes.Buffer
	if err := s.pages[name].Execute(&buf, f); err != nil {
		http.Error(w, "console: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'")
	w.WriteHeader(code)
	_, _ = w.Write(buf.Bytes())
}

func (s *server) message(w http.ResponseWriter, r *http.Request, code int, title, text string) {
	s.render(w, r, code, "message", title, text)
}

// busy answers a page the operations limit refused: 503, and the page
// reloads itself after retry.
func (s *server) busy(w http.ResponseWriter, r *http.Request, retry time.Duration) {
	f := frame{Title: "Busy", SignedIn: s.g.signedIn(r), HasToken: s.g.hasTok, CSRF: s.g.csrf(r), Refresh: int(retry.Seconds()),
		Body: "The operations port is serving as many reads of Postgres as it may (http.max_concurrent); this page reloads in " + retry.String() + "."}
	s.draw(w, http.StatusServiceUnavailable, "message", f)
}

func (s *server) loginPage(w http.ResponseWriter, r *http.Request) {
	if !s.g.hasTok {
		http.Redirect(w, r, "/ui", http.StatusSeeOther)
		return
	}
	s.render(w, r, http.StatusOK, "login", "Sign in", map[string]string{"Next": safeNext(r.URL.Query().Get("next"))})
}

// loginPost signs a browser in with the token; it is protected from
// cross-origin posts like every write, though it needs no session.
func (s *server) loginPost(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := s.g.origin.Check(r); err != nil {
		s.message(w, r, http.StatusForbidden, "Refused", "refused: a cross-origin request")
		return
	}
	next := safeNext(r.PostFormValue("next"))
	name, ok := s.g.tokenName(r.PostFormValue("token"))
	if !ok {
		s.d.Log.Warn("console sign-in refused", "remote_addr", r.RemoteAddr)
		s.render(w, r, http.StatusUnauthorized, "login", "Sign in", map[string]string{"Next": next, "Error": "wrong token"})
		return
	}
	s.g.login(w, r, name)
	s.d.Log.Info("console signed in", "token", name, "remote_addr", r.RemoteAddr)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (s *server) logoutPost(w http.ResponseWriter, r *http.Request) {
	logout(w)
	http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
}

// safeNext is next when it is a console path, else /ui: a login never
// sends the browser elsewhere.
func safeNext(next string) string {
	if strings.HasPrefix(next, "/ui") && !strings.HasPrefix(next, "//") && !strings.ContainsAny(next, "\\\r\n") {
		return next
	}
	return "/ui"
}

// overviewBody is the overview page's data.
type overviewBody struct {
	Overview
	DeliveredChart, PendingChart template.HTML
	Spark                        map[string]template.HTML
	Window                       time.Duration
	Flash                        string
}

func (s *server) overview(w http.ResponseWriter, r *http.Request) {
	c, cancel := ctx(r, 3*time.Second)
	defer cancel()
	ov, err := s.d.Backend.Overview(c)
	if err != nil {
		s.message(w, r, http.StatusServiceUnavailable, "Not available", err.Error())
		return
	}
	b := overviewBody{Overview: ov, Flash: r.URL.Query().Get("done"), Spark: map[string]template.HTML{}}
	if s.d.Samples != nil {
		samples := s.d.Samples.Samples()
		now := s.d.Now()
		b.Window = time.Duration(len(s.d.Samples.buf)) * s.d.Samples.every
		b.DeliveredChart = svgChart("events delivered and failed attempts per second", now, b.Window,
			line{"delivered", "delivered per second", rate(samples, func(x Sample) float64 { return x.Delivered })},
			line{"failed", "failed attempts per second", rate(samples, func(x Sample) float64 { return x.Failures })})
		b.PendingChart = svgChart("pending events", now, b.Window,
			line{"pending", "pending events", level(samples, func(x Sample) float64 { return x.Pending })})
		for _, d := range ov.Destinations {
			name := d.Name
			b.Spark[name] = svgChart(name+": delivered per second", now, b.Window,
				line{"delivered", "delivered per second", rate(samples, func(x Sample) float64 { return x.ByDest[name] })})
		}
	}
	s.render(w, r, http.StatusOK, "overview", "Overview", b)
}

// deadBody is the dead-letter list page's data.
type deadBody struct {
	Page                  store.DeadPage
	Values                map[string]string // the filter form's values
	Replay, Discard, Next template.URL      // the action links and the next page ("" on the last)
	Error                 string
}

func (s *server) deadList(w http.ResponseWriter, r *http.Request) {
	v := r.URL.Query()
	b := deadBody{Values: map[string]string{}}
	for _, n := range deadquery.All {
		b.Values[n] = v.Get(n)
	}
	fs := formFields(v, deadFields)
	b.Replay, b.Discard = link("/ui/confirm/replay", encode(fs)), link("/ui/confirm/discard", encode(fs))
	q, err := parseList(v, s.d.Now())
	if err != nil {
		b.Error = err.Error()
		s.render(w, r, http.StatusBadRequest, "dead", "Dead letters", b)
		return
	}
	c, cancel := ctx(r, 5*time.Second)
	defer cancel()
	if b.Page, err = s.d.Backend.DeadList(c, admin.DeadListRequest{Filter: q.Filter, After: q.After, Limit: q.Limit}); err != nil {
		s.message(w, r, errStatus(err), "Not available", err.Error())
		return
	}
	if b.Page.Next != "" {
		next := url.Values{}
		for _, f := range fs {
			next.Add(f.Name, f.Value)
		}
		next.Set(deadquery.After, b.Page.Next)
		if l := v.Get(deadquery.Limit); l != "" {
			next.Set(deadquery.Limit, l)
		}
		b.Next = link("/ui/dead", next.Encode())
	}
	s.render(w, r, http.StatusOK, "dead", "Dead letters", b)
}

// rowBody is one dead row's page data.
type rowBody struct {
	Event            store.DeadEvent
	History          []store.Attempt
	Shown            bool // payload and headers shown
	Payload, Headers string
}

func (s *server) deadRow(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		s.message(w, r, http.StatusBadRequest, "Bad request", "want an outbox id (a whole number)")
		return
	}
	c, cancel := ctx(r, 5*time.Second)
	defer cancel()
	shown, err := s.d.Backend.DeadShow(c, id)
	if err != nil {
		s.message(w, r, errStatus(err), "Not available", err.Error())
		return
	}
	e := shown.DeadEvent
	b := rowBody{Event: e, History: shown.History, Shown: s.payloadsShown(r)}
	if b.Shown {
		b.Payload, b.Headers = indent(e.Payload), indent(e.Headers)
	}
	b.Event.Payload, b.Event.Headers = nil, nil // never drawn unless Shown
	s.render(w, r, http.StatusOK, "row", "Dead letter "+strconv.FormatInt(id, 10), b)
}

// indent is raw JSON indented for reading.
func indent(raw json.RawMessage) string {
	var buf bytes.Buffer
	if len(raw) == 0 || json.Indent(&buf, raw, "", "  ") != nil {
		return string(raw)
	}
	return buf.String()
}

// link is path with the encoded query (url.Values.Encode), as a URL the
// templates write as it is rather than escape again.
func link(path, query string) template.URL {
	if query == "" {
		return template.URL(path) //nolint:gosec // a fixed path
	}
	return template.URL(path + "?" + query) //nolint:gosec // a fixed path and an encoded query
}

// ago is how long before now t was, rounded for reading ("" for zero).
func ago(t, now time.Time) string {
	if t.IsZero() {
		return ""
	}
	d := now.Sub(t)
	switch {
	case d < time.Minute:
		return d.Round(time.Second).String() + " ago"
	case d < time.Hour:
		return d.Round(time.Minute).String() + " ago"
	}
	return d.Round(time.Hour).String() + " ago"
}
