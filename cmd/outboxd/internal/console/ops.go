package console

import (
	"context"
	"errors"
	"html/template"
	"net/http"
	"net/url"
	"time"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/admin"
)

// opWait is how long a console write waits for lock:reconciliation, and a
// pause or resume for the leader to take it into effect.
const opWait = 10 * time.Second

// outcome is what a write did, or a dry run would do.
type outcome struct {
	N          int64
	Gone       []int64   // resend: ids asked for that have no row any more
	GoneBefore time.Time // resend: rows older than this were purged
}

// run does op on sel for caller (all: the operator said every row), or
// counts it when dry.
func (s *server) run(ctx context.Context, caller admin.Caller, op Op, sel selection, all, dry bool) (outcome, error) {
	switch op {
	case OpReplay:
		res, err := s.d.Backend.Replay(ctx, caller, admin.DeadWriteRequest{Filter: sel.dead, All: all, DryRun: dry, LockWait: opWait})
		return outcome{N: res.Count}, err
	case OpDiscard:
		res, err := s.d.Backend.Discard(ctx, caller, admin.DeadWriteRequest{Filter: sel.dead, All: all, DryRun: dry, LockWait: opWait})
		return outcome{N: res.Count}, err
	case OpResend:
		res, err := s.d.Backend.Resend(ctx, caller, admin.ResendRequest{Filter: sel.resend, All: all, DryRun: dry, Limit: sel.limit, LockWait: opWait,
			Destination: sel.dest})
		return outcome{N: res.Count, Gone: res.Gone, GoneBefore: res.GoneBefore}, err
	}
	return outcome{}, errors.New("no such operation")
}

// confirmBody is the confirmation page's data: how many rows op changes.
type confirmBody struct {
	Op, Verb, Past, Rows string
	outcome
	Every    bool // no filter: every row
	Fields   []field
	Filters  string       // shown
	Cancel   template.URL // back
	CanWrite bool
}

// confirm counts what op would change (a dry run: nothing changes, no
// lock is taken) and shows the form that does it.
func (s *server) confirm(w http.ResponseWriter, r *http.Request) {
	op := Op(r.PathValue("op"))
	words, ok := opWords[op]
	if !ok {
		s.message(w, r, http.StatusNotFound, "Not found", "no such operation")
		return
	}
	v := r.URL.Query()
	sel, err := parseSelection(op, v, s.d.Now())
	if err != nil {
		s.message(w, r, http.StatusBadRequest, "Bad request", err.Error())
		return
	}
	c, cancel := ctx(r, 5*time.Second)
	defer cancel()
	out, err := s.run(c, s.caller(r), op, sel, true, true)
	if err != nil {
		s.message(w, r, errStatus(err), "Not available", err.Error())
		return
	}
	fs := formFields(v, words.fields)
	back := link("/ui/dead", encode(formFields(v, deadFields)))
	if op == OpResend {
		back = link("/ui/resend", encode(fs))
	}
	s.render(w, r, http.StatusOK, "confirm", words.verb+"?", confirmBody{
		Op: string(op), Verb: words.verb, Past: words.past, Rows: words.rows, outcome: out, Every: len(fs) == 0 || onlyBounds(fs),
		Fields: fs, Filters: encode(fs), Cancel: back, CanWrite: s.g.signedIn(r),
	})
}

// onlyBounds: the fields select no rows by themselves (resend's column
// choice and limit are not filters, and a destination's whole history is
// every row as far as the confirmation goes).
func onlyBounds(fs []field) bool {
	for _, f := range fs {
		if f.Name != onParam && f.Name != "limit" && f.Name != destParam {
			return false
		}
	}
	return true
}

// resultBody is what a confirmed write did.
type resultBody struct {
	Verb, Past string
	outcome
	Error string
}

// allField is the confirmation's box saying every row is meant.
const allField = "all"

// apply does a confirmed write and shows what it changed.
func (s *server) apply(w http.ResponseWriter, r *http.Request) {
	op := Op(r.PathValue("op"))
	words, ok := opWords[op]
	if !ok {
		s.message(w, r, http.StatusNotFound, "Not found", "no such operation")
		return
	}
	sel, err := parseSelection(op, r.PostForm, s.d.Now(), csrfField, allField)
	if err != nil {
		s.message(w, r, http.StatusBadRequest, "Bad request", err.Error())
		return
	}
	c, cancel := ctx(r, 2*time.Minute)
	defer cancel()
	who := s.caller(r)
	out, err := s.run(c, who, op, sel, r.PostFormValue(allField) == "yes", false)
	b := resultBody{Verb: words.verb, Past: words.past, outcome: out}
	code := http.StatusOK
	attrs := []any{"op", string(op), "caller", who.Name, "changed", out.N, "filter", encode(formFields(r.PostForm, words.fields)), "remote_addr", r.RemoteAddr}
	if err != nil {
		b.Error, code = err.Error(), errStatus(err)
		s.d.Log.Warn("console write refused", append(attrs, "error", err)...)
	} else {
		s.d.Log.Info("console write", attrs...)
	}
	s.render(w, r, code, "result", words.verb, b)
}

// resendForm is the form that selects delivered rows to resend; it leads
// to the confirmation.
func (s *server) resendForm(w http.ResponseWriter, r *http.Request) {
	v := r.URL.Query()
	vals := map[string]string{}
	for _, n := range resendFields {
		vals[n] = v.Get(n)
	}
	s.render(w, r, http.StatusOK, "resend", "Resend delivered events", vals)
}

// pause serves the pause (on) or resume toggle of one destination: the
// fenced write, then a wait for the leader to take it into effect.
func (s *server) pause(on bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		name, verb, do := r.PathValue("name"), "resume", s.d.Backend.Resume
		if on {
			verb, do = "pause", s.d.Backend.Pause
		}
		c, cancel := ctx(r, time.Minute)
		defer cancel()
		who := s.caller(r)
		res, err := do(c, who, admin.PauseRequest{Destinations: []string{name}, LockWait: opWait, Wait: opWait})
		attrs := []any{"op", verb, "caller", who.Name, "destination", name, "remote_addr", r.RemoteAddr}
		if err != nil {
			s.d.Log.Warn("console write refused", append(attrs, "error", err)...)
			s.message(w, r, errStatus(err), "Not done", verb+" "+name+": "+err.Error())
			return
		}
		effect := "acknowledged by the leader " + res.Effect.Leader
		if res.Effect.NoLeader {
			effect = "no replica leads: the next leader reads it before its first send"
		}
		s.d.Log.Info("console write", append(attrs, "in_effect", effect)...)
		http.Redirect(w, r, "/ui?done="+url.QueryEscape(verb+" "+name+": "+effect), http.StatusSeeOther)
	}
}
