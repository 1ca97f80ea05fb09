package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/deadquery"
	"github.com/outboxd/outboxd/store"
)

// The parameters of the writes beyond the dead-letter filters
// (deadquery.Filters), as flags (--name) and as keys of a write's JSON body.
const (
	ID        = "id"         // ids, comma-separated
	IDFrom    = "id-from"    // resend: id at least
	IDTo      = "id-to"      // resend: id at most
	TimeField = "time-field" // resend: since/until bound created_at or dispatched_at
	Limit     = "limit"      // resend: at most this many rows
	All       = "all"        // discard, resend: every row when no filter is given
	DryRun    = "dry-run"    // count, change nothing
	LockWait  = "lock-wait"  // how long to wait for lock:reconciliation
	// Destination: resend only the rows the routes send to this destination.
	DestinationParam = "destination"
)

// Params are a write's parameters by name, each as its flag's text.
type Params map[string]string

// DecodeParams reads a write's JSON body: an object whose keys are the
// parameters' names and whose values are strings, booleans, numbers or
// (for id) arrays of ids. An unknown key is an error naming it.
func DecodeParams(body []byte, known []string) (Params, error) {
	var raw map[string]json.RawMessage
	if len(strings.TrimSpace(string(body))) == 0 {
		return Params{}, nil
	}
	if err := json.Unmarshal(body, &raw); err != nil {
		return nil, &deadquery.ParamError{Name: "body", Err: fmt.Errorf("want a JSON object: %w", err)}
	}
	p := Params{}
	for k, v := range raw {
		if !slices.Contains(known, k) {
			return nil, &deadquery.ParamError{Name: k, Err: fmt.Errorf("unknown parameter (known: %v)", known)}
		}
		var s string
		var ids []int64
		var names []string
		switch {
		case json.Unmarshal(v, &s) == nil:
		case json.Unmarshal(v, &names) == nil:
			s = strings.Join(names, ",")
		case json.Unmarshal(v, &ids) == nil:
			parts := make([]string, len(ids))
			for i, id := range ids {
				parts[i] = strconv.FormatInt(id, 10)
			}
			s = strings.Join(parts, ",")
		default:
			s = string(v) // true, false, a number
		}
		p[k] = s
	}
	return p, nil
}

// Get is p as deadquery's getter.
func (p Params) Get(name string) (string, bool) { v, ok := p[name]; return v, ok }

// Bool reads a boolean parameter (absent: false).
func (p Params) Bool(name string) (bool, error) {
	v, ok := p[name]
	if !ok {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, &deadquery.ParamError{Name: name, Err: fmt.Errorf("want true or false, got %q", v)}
	}
	return b, nil
}

// Duration reads a positive duration (absent: 0).
func (p Params) Duration(name string) (time.Duration, error) {
	v, ok := p[name]
	if !ok {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, &deadquery.ParamError{Name: name, Err: fmt.Errorf("want a positive duration, got %q", v)}
	}
	return d, nil
}

// IDs reads a comma-separated list of ids.
func (p Params) IDs(name string) ([]int64, error) {
	v, ok := p[name]
	if !ok {
		return nil, nil
	}
	var out []int64
	for _, s := range strings.Split(v, ",") {
		id, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil {
			return nil, &deadquery.ParamError{Name: name, Err: fmt.Errorf("want outbox ids, got %q", v)}
		}
		out = append(out, id)
	}
	return out, nil
}

// int reads a whole number >= 1 (absent: 0).
func (p Params) int(name string) (int64, error) {
	v, ok := p[name]
	if !ok {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 1 {
		return 0, &deadquery.ParamError{Name: name, Err: fmt.Errorf("want a whole number of 1 or more, got %q", v)}
	}
	return n, nil
}

// DeadWriteParams are the keys of a replay's or discard's body.
var DeadWriteParams = append([]string{ID, All, DryRun, LockWait}, deadquery.Filters...)

// ResendParams are the keys of a resend's body (and its flags).
var ResendParams = append([]string{ID, IDFrom, IDTo, TimeField, Limit, DestinationParam, All, DryRun, LockWait}, deadquery.Filters...)

// PauseParams are the keys of a pause's or resume's body.
var PauseParams = []string{"destinations", All, LockWait, "wait"}

// DeadWrite reads a replay's or discard's parameters.
func (p Params) DeadWrite(now time.Time) (DeadWriteRequest, error) {
	var req DeadWriteRequest
	q, err := deadquery.Parse(p.only(deadquery.Filters), now)
	if err != nil {
		return req, err
	}
	req.Filter = q.Filter
	if req.Filter.IDs, err = p.IDs(ID); err != nil {
		return req, err
	}
	if req.All, err = p.Bool(All); err != nil {
		return req, err
	}
	if req.DryRun, err = p.Bool(DryRun); err != nil {
		return req, err
	}
	req.LockWait, err = p.Duration(LockWait)
	return req, err
}

// Resend reads a resend's parameters: the dead-letter filters (since and
// until on created_at, or dispatched_at with time-field), ids and an id
// range, a destination, a limit, all, dry-run and lock-wait.
func (p Params) Resend(now time.Time) (ResendRequest, error) {
	var req ResendRequest
	q, err := deadquery.Parse(p.only(deadquery.Filters), now)
	if err != nil {
		return req, err
	}
	d := q.Filter
	f := store.ResendFilter{AggregateType: d.AggregateType, AggregateID: d.AggregateID, EventType: d.EventType,
		Since: d.Since, Until: d.Until, SinceAgo: d.SinceAgo, UntilAgo: d.UntilAgo, Error: d.Error}
	switch v, _ := p.Get(TimeField); v {
	case "", "created_at":
	case "dispatched_at":
		f.Dispatched = true
	default:
		return req, &deadquery.ParamError{Name: TimeField, Err: fmt.Errorf("want created_at or dispatched_at, got %q", v)}
	}
	if f.IDs, err = p.IDs(ID); err != nil {
		return req, err
	}
	if f.FromID, err = p.int(IDFrom); err != nil {
		return req, err
	}
	if f.ToID, err = p.int(IDTo); err != nil {
		return req, err
	}
	if f.FromID > 0 && f.ToID > 0 && f.FromID > f.ToID {
		return req, &deadquery.ParamError{Name: IDFrom, Err: errors.New("is above id-to")}
	}
	limit, err := p.int(Limit)
	if err != nil {
		return req, err
	}
	req.Filter, req.Limit = f, int(min(limit, 1<<31-1))
	req.Destination, _ = p.Get(DestinationParam)
	if req.All, err = p.Bool(All); err != nil {
		return req, err
	}
	if req.DryRun, err = p.Bool(DryRun); err != nil {
		return req, err
	}
	req.LockWait, err = p.Duration(LockWait)
	return req, err
}

// Pause reads a pause's or resume's parameters.
func (p Params) Pause() (PauseRequest, error) {
	var req PauseRequest
	var err error
	if v, ok := p.Get("destinations"); ok {
		req.Destinations = strings.Split(v, ",")
	}
	if req.All, err = p.Bool(All); err != nil {
		return req, err
	}
	if req.LockWait, err = p.Duration(LockWait); err != nil {
		return req, err
	}
	req.Wait, err = p.Duration("wait")
	return req, err
}

// only is p's getter restricted to names.
func (p Params) only(names []string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		if !slices.Contains(names, name) {
			return "", false
		}
		return p.Get(name)
	}
}
